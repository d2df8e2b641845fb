"""The idle-wait plugin: an engine holding only finished KV waits for input instead of spinning."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import pytest

from pdx_engine import idle_wait


class Request:
    def __init__(self, finished: bool) -> None:
        self.finished = finished

    def is_finished(self) -> bool:
        return self.finished


class Scheduler:
    """Tracks `unfinished` live requests and `held` finished ones whose blocks a peer may read."""

    def __init__(self, unfinished: int, held: int) -> None:
        self.requests = {f"r{i}": Request(finished=i >= unfinished) for i in range(unfinished + held)}


class Core:
    """The parts of vLLM's EngineCoreProc that the wrapper touches."""

    def __init__(self, scheduler: Scheduler, executed: bool = False) -> None:
        self.scheduler = scheduler
        self.input_queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.executed = executed
        self.handled: list[tuple[str, Any]] = []
        self.steps = 0

    def _process_engine_step(self) -> bool:
        self.steps += 1
        return self.executed

    def _handle_client_request(self, kind: str, request: Any) -> None:
        self.handled.append((kind, request))


def patched_core_class() -> type[Core]:
    class Patched(Core):
        pass

    assert idle_wait.patch(Patched, 0.2)
    return Patched


def test_an_engine_holding_only_finished_kv_hands_a_new_request_over_at_once() -> None:
    core = patched_core_class()(Scheduler(unfinished=0, held=1))
    threading.Timer(0.02, core.input_queue.put, args=(("ADD", "req-1"),)).start()
    core._process_engine_step()
    assert core.handled == [("ADD", "req-1")]


def test_with_no_input_the_wait_ends_after_the_configured_time() -> None:
    core = patched_core_class()(Scheduler(unfinished=0, held=1))
    start = time.monotonic()
    core._process_engine_step()
    assert core.handled == []
    assert time.monotonic() - start >= 0.19


@pytest.mark.parametrize(
    ("scheduler", "executed"),
    [
        (Scheduler(unfinished=1, held=1), False),  # a request waits for remote KV: keep polling
        (Scheduler(unfinished=0, held=1), True),  # the model ran: the next step may have work
        (Scheduler(unfinished=0, held=0), False),  # nothing at all: vLLM's own loop blocks
    ],
)
def test_no_wait_while_there_is_work_or_nothing_is_held(scheduler: Scheduler, executed: bool) -> None:
    core = patched_core_class()(scheduler, executed)
    core.input_queue.put(("ADD", "req-1"))
    assert core._process_engine_step() is executed
    assert core.handled == []  # left for vLLM's own input handling
    assert core.input_queue.qsize() == 1


def test_patching_twice_keeps_one_wrapper() -> None:
    cls = patched_core_class()
    assert not idle_wait.patch(cls, 5.0)
    core = cls(Scheduler(unfinished=0, held=1))
    start = time.monotonic()
    core._process_engine_step()
    assert time.monotonic() - start < 2.0
    assert core.steps == 1



def test_unset_means_no_change() -> None:
    assert idle_wait.wait_from_env({}) is None


def test_the_installed_vllm_engine_core_has_what_the_wrapper_uses() -> None:
    core = pytest.importorskip("vllm.v1.engine.core")
    proc = core.EngineCoreProc
    assert callable(proc._process_engine_step) and callable(proc._handle_client_request)
    from vllm.v1.request import Request as VllmRequest

    assert callable(VllmRequest.is_finished)
