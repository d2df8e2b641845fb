"""vLLM general plugin: an engine that only holds finished KV for others waits, not spins.

With bidirectional transfer, decode keeps each finished turn's blocks for
``decoder_kv_blocks_ttl`` (480 s by default) and prefill keeps its blocks until decode has read
them. vLLM 0.32 counts those finished-but-held requests as work, so the engine core steps
about once a millisecond for as long as any are held, and every step is an RPC that keeps the
worker process busy-polling its queue. On a GPU node that is a core of many; on a 2-core machine
it is most of the machine, and the kernel's per-CPU work starved behind it (``workqueue
lockup`` in dmesg) while turns stalled for 30-80 s.

With ``PDX_ENGINE_IDLE_WAIT_MS`` set, a step that ran no model and left only such held requests
is followed by a wait on the engine's input queue of at most that long. A new request, an abort
or a utility call ends the wait at once, so TTFT does not change; expiry and release of held
blocks happen up to that much later, which the TTL and the 30 s lease absorb.

Unset (the default, and what the operator renders for GPU nodes) changes nothing.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
from collections.abc import Callable, Mapping
from typing import Any

from pdx_engine.plugin_env import positive_int

logger = logging.getLogger("vllm.pdx_plugin")

ENV = "PDX_ENGINE_IDLE_WAIT_MS"
_MARK = "_pdx_idle_wait_s"


def wait_from_env(environ: Mapping[str, str] = os.environ) -> float | None:
    """The requested wait in seconds, None when unset."""
    ms = positive_int(ENV, "milliseconds", environ)
    return None if ms is None else ms / 1000


def only_held_requests(scheduler: Any) -> bool:
    """Every request the scheduler still tracks has finished: its blocks are only held for a peer.

    Asked of each request rather than of the queue counts: a request whose KV is still being
    fetched may sit in none of the waiting queues, and it must keep the engine stepping.
    """
    requests = scheduler.requests.values()
    return bool(requests) and all(request.is_finished() for request in requests)


def wrap_step(step: Callable[[Any], bool], wait_s: float) -> Callable[[Any], bool]:
    """``EngineCoreProc._process_engine_step`` followed, when idle, by a wait for input."""

    @functools.wraps(step)
    def process_engine_step(core: Any) -> bool:
        executed = step(core)
        if executed or not only_held_requests(core.scheduler):
            return executed
        try:
            request = core.input_queue.get(timeout=wait_s)
        except queue.Empty:
            return executed
        core._handle_client_request(*request)
        return executed

    setattr(process_engine_step, _MARK, wait_s)
    return process_engine_step


def patch(engine_core_proc: type, wait_s: float) -> bool:
    """Install the wait on ``EngineCoreProc``; False if already installed."""
    current = engine_core_proc._process_engine_step  # type: ignore[attr-defined]
    if getattr(current, _MARK, None) is not None:
        return False
    engine_core_proc._process_engine_step = wrap_step(current, wait_s)  # type: ignore[attr-defined]
    return True


def register() -> None:
    """Entry point (``vllm.general_plugins``); a no-op unless the variable is set."""
    wait_s = wait_from_env()
    if wait_s is None:
        return
    from vllm.v1.engine.core import EngineCoreProc

    if patch(EngineCoreProc, wait_s):
        logger.info("pdx plugin: an engine holding only finished KV waits up to %.0f ms for input", wait_s * 1000)
