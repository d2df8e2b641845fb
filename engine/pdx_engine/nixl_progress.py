"""vLLM general plugin: let NIXL's UCX progress thread sleep instead of spin.

The NIXL Python agent builds its C++ agent with ``pthrDelay = 0``, so the UCX backend's
shared progress thread polls its workers with a zero timeout: each idle engine burns about
one core. vLLM exposes no knob for it. On a GPU node that is a price paid for latency; on a
2-core machine running prefill, decode and a router it starves the engines (prefill of a
1.3k-token turn took 11-24 s instead of well under one, and NIXL transfers missed their
leases). With ``PDX_NIXL_PROGRESS_DELAY_US`` set, the agent is built with that delay: the
thread blocks in ``poll()`` on the UCX event descriptors for at most that long (rounded up to
whole milliseconds by NIXL) and still wakes at once on completions.

Unset (the default, and what the operator renders for GPU nodes) changes nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from pdx_engine.plugin_env import positive_int

logger = logging.getLogger("vllm.pdx_plugin")

ENV = "PDX_NIXL_PROGRESS_DELAY_US"
_MARK = "_pdx_progress_delay_us"


class _AgentWithDelay:
    """Stands in for NIXL's bindings module; only agent construction differs."""

    def __init__(self, bindings: ModuleType, delay_us: int) -> None:
        self._bindings = bindings
        setattr(self, _MARK, delay_us)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bindings, name)

    def nixlAgent(self, name: str, config: Any) -> Any:
        config.pthrDelay = getattr(self, _MARK)
        return self._bindings.nixlAgent(name, config)


def delay_from_env(environ: Mapping[str, str] = os.environ) -> int | None:
    """The requested delay in microseconds, None when unset."""
    return positive_int(ENV, "microseconds", environ)


def patch(api: ModuleType, delay_us: int) -> bool:
    """Make ``api`` (NIXL's ``_api`` module) build agents with ``delay_us``; False if already done."""
    current = getattr(api, "nixlBind")  # noqa: B009 (not in NIXL's type stub)
    if getattr(current, _MARK, None) is not None:
        return False
    setattr(api, "nixlBind", _AgentWithDelay(current, delay_us))  # noqa: B010
    return True


def register() -> None:
    """Entry point (``vllm.general_plugins``); a no-op unless the variable is set."""
    delay_us = delay_from_env()
    if delay_us is None:
        return
    # vLLM sets this when it is first to import NIXL (a UCX leak workaround); importing
    # NIXL here first would keep it from doing so.
    os.environ.setdefault("UCX_RCACHE_MAX_UNRELEASED", "1024")
    try:
        import nixl._api as api  # the package maps this to the installed nixl_cu12/cu13 build
    except ImportError:
        return
    if patch(api, delay_us):
        logger.info("pdx plugin: NIXL progress thread waits up to %d us between polls", delay_us)
