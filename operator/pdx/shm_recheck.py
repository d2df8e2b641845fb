"""vLLM general plugin: bound the cost of a lost wake-up between engine core and worker.

vLLM's shared-memory queue wakes an idle reader with a ZeroMQ ping sent *before* the block's
written flag is set. A reader that wakes, finds the flag still clear and parks again has lost
that ping and sleeps until its periodic re-check, 5 s in vLLM 0.32. On a busy 2-core machine
the race is common: decode's first token, after an idle spell, came 0.3-1 s late (one RPC per
step, each possibly late). With ``PDX_SHM_RECHECK_MS`` set, idle readers re-check that often;
a re-check is one flag read, so a few milliseconds cost well under 1% of a core.

Unset (the default, and what the operator renders for GPU nodes) changes nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from types import ModuleType

from pdx.plugin_env import positive_int

logger = logging.getLogger("vllm.pdx_plugin")

ENV = "PDX_SHM_RECHECK_MS"
_CONSTANT = "SHM_READER_RECHECK_INTERVAL_MS"


def recheck_from_env(environ: Mapping[str, str] = os.environ) -> int | None:
    """The requested interval in milliseconds, None when unset."""
    return positive_int(ENV, "milliseconds", environ)


def patch(shm_broadcast: ModuleType, interval_ms: int) -> bool:
    """Set the re-check interval; False if the installed vLLM has no such constant."""
    if not isinstance(getattr(shm_broadcast, _CONSTANT, None), int):
        logger.warning("pdx plugin: %s.%s not found; not changed", shm_broadcast.__name__, _CONSTANT)
        return False
    setattr(shm_broadcast, _CONSTANT, interval_ms)
    return True


def register() -> None:
    """Entry point (``vllm.general_plugins``); a no-op unless the variable is set."""
    interval_ms = recheck_from_env()
    if interval_ms is None:
        return
    from vllm.distributed.device_communicators import shm_broadcast

    if patch(shm_broadcast, interval_ms):
        logger.info("pdx plugin: idle shared-memory queue readers re-check every %d ms", interval_ms)
