"""The shm re-check plugin: idle queue readers re-check at the configured interval."""

from __future__ import annotations

import types

import pytest

from pdx_engine import shm_recheck


def test_the_interval_constant_is_replaced() -> None:
    module = types.ModuleType("fake_shm_broadcast")
    module.SHM_READER_RECHECK_INTERVAL_MS = 5000  # type: ignore[attr-defined]
    assert shm_recheck.patch(module, 2)
    assert module.SHM_READER_RECHECK_INTERVAL_MS == 2


def test_a_vllm_without_the_constant_is_left_alone() -> None:
    module = types.ModuleType("fake_shm_broadcast")
    assert not shm_recheck.patch(module, 2)
    assert not hasattr(module, "SHM_READER_RECHECK_INTERVAL_MS")



def test_the_installed_vllm_reads_the_constant_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    shm = pytest.importorskip("vllm.distributed.device_communicators.shm_broadcast")
    monkeypatch.setattr(shm, "SHM_READER_RECHECK_INTERVAL_MS", shm.SHM_READER_RECHECK_INTERVAL_MS)
    monkeypatch.setenv(shm_recheck.ENV, "3")
    shm_recheck.register()
    timeout = shm.MessageQueue.ReadTimeoutWithWarnings(timeout=None, should_warn=False)
    assert timeout.timeout_ms() == 3


class Condition:
    def __init__(self) -> None:
        self.busy_loop_s = 1.0
        self.waits = 0

    def wait(self, timeout_ms: int | None = None) -> None:
        self.waits += 1


def test_readers_spin_at_most_the_cap_even_when_created_before_the_patch() -> None:
    class Patched(Condition):
        pass

    early = Patched()
    assert shm_recheck.cap_busy_loop(Patched, 0.02)
    assert not shm_recheck.cap_busy_loop(Patched, 0.5)
    early.wait(5)
    assert early.busy_loop_s == 0.02 and early.waits == 1
    idle_writer = Patched()
    idle_writer.busy_loop_s = 0.0  # writers never spin: left as they are
    idle_writer.wait()
    assert idle_writer.busy_loop_s == 0.0


def test_the_installed_vllm_spin_condition_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    shm = pytest.importorskip("vllm.distributed.device_communicators.shm_broadcast")
    monkeypatch.setattr(shm.SpinCondition, "wait", shm.SpinCondition.wait)  # restored after the test
    monkeypatch.setenv(shm_recheck.BUSY_ENV, "20")
    shm_recheck.register()
    assert shm.SpinCondition.wait._pdx_busy_loop_s == 0.02
