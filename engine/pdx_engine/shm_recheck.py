"""vLLM general plugin: bound the cost of a lost wake-up between engine core and worker.

vLLM's shared-memory queue wakes an idle reader with a ZeroMQ ping sent *before* the block's
written flag is set. A reader that wakes, finds the flag still clear and parks again has lost
that ping and sleeps until its periodic re-check, 5 s in vLLM 0.32. On a busy 2-core machine
the race is common: decode's first token, after an idle spell, came 0.3-1 s late (one RPC per
step, each possibly late). With ``PDX_SHM_RECHECK_MS`` set, idle readers re-check that often;
a re-check is one flag read, so a few milliseconds cost well under 1% of a core.

``PDX_SHM_BUSY_LOOP_MS`` shortens the other half of that queue's idling: after each read a
reader spins (``sched_yield``) for 1 s before it sleeps. Between turns that spin is a busy core
on a 2-core machine, and turns stalled behind it for about 1 s.

Unset (the default, and what the operator renders for GPU nodes) changes nothing.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from pdx_engine.plugin_env import positive_int

logger = logging.getLogger("vllm.pdx_plugin")

ENV = "PDX_SHM_RECHECK_MS"
BUSY_ENV = "PDX_SHM_BUSY_LOOP_MS"
_CONSTANT = "SHM_READER_RECHECK_INTERVAL_MS"
_MARK = "_pdx_busy_loop_s"


def recheck_from_env(environ: Mapping[str, str] = os.environ) -> int | None:
    """The requested interval in milliseconds, None when unset."""
    return positive_int(ENV, "milliseconds", environ)


def busy_loop_from_env(environ: Mapping[str, str] = os.environ) -> int | None:
    """The requested spin window in milliseconds, None when unset."""
    return positive_int(BUSY_ENV, "milliseconds", environ)


def cap_busy_loop(spin_condition: type, busy_loop_s: float) -> bool:
    """Readers spin at most ``busy_loop_s`` after a read; False if already capped.

    Applied on every wait, so queues created before the plugin loaded are capped too.
    """
    original = spin_condition.wait  # type: ignore[attr-defined]
    if getattr(original, _MARK, None) is not None:
        return False

    @functools.wraps(original)
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.busy_loop_s > busy_loop_s:
            self.busy_loop_s = busy_loop_s
        return original(self, *args, **kwargs)

    setattr(wait, _MARK, busy_loop_s)
    spin_condition.wait = wait  # type: ignore[attr-defined]
    return True


def patch(shm_broadcast: ModuleType, interval_ms: int) -> bool:
    """Set the re-check interval; False if the installed vLLM has no such constant."""
    if not isinstance(getattr(shm_broadcast, _CONSTANT, None), int):
        logger.warning("pdx plugin: %s.%s not found; not changed", shm_broadcast.__name__, _CONSTANT)
        return False
    setattr(shm_broadcast, _CONSTANT, interval_ms)
    return True


def register() -> None:
    """Entry point (``vllm.general_plugins``); a no-op unless the variable is set."""
    interval_ms, busy_ms = recheck_from_env(), busy_loop_from_env()
    if interval_ms is None and busy_ms is None:
        return
    from vllm.distributed.device_communicators import shm_broadcast

    if interval_ms is not None and patch(shm_broadcast, interval_ms):
        logger.info("pdx plugin: idle shared-memory queue readers re-check every %d ms", interval_ms)
    if busy_ms is not None and cap_busy_loop(shm_broadcast.SpinCondition, busy_ms / 1000):
        logger.info("pdx plugin: shared-memory queue readers spin at most %d ms after a read", busy_ms)
