"""The shm re-check plugin: idle queue readers re-check at the configured interval."""

from __future__ import annotations

import types

import pytest

from pdx import shm_recheck


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
