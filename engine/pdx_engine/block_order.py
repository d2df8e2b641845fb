"""vLLM general plugin: hand out KV blocks in ascending id order, so NIXL moves runs, not blocks.

NIXL (1.4 on) merges the pairs of a prepared transfer into one copy where both sides' block
indices run *up* by one; a run that goes down, or up on one side and down on the other, stays
one copy per block and region. vLLM's block pool frees a request's blocks tail first and hands
out free blocks from the head of its queue, so once an engine has served a few requests a new
allocation comes out in descending ids. Seen on CPU engines: decode's blocks for a turn's
P->D read ran 34, 33, ... 26 against prefill's 35, 36, ... 44, and each of those pairs was a
copy of its own. On a GPU each copy costs its post time (docs/engine-notes.md: halving the
block size doubled a D->P read's post time).

Which blocks an allocation takes is vLLM's eviction policy and stays as it is; only the order
in which they fill the request's positions changes, and nothing reads meaning into that order:
a block's id is an address, its content is found by hash. Sorted, a request's blocks are
ascending wherever the pool gave out a contiguous range, on both engines, and a transfer of
them merges.

On by default; ``PDX_ASCENDING_BLOCKS=0`` keeps vLLM's order.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from pdx_engine.import_hook import module_exists, on_import
from pdx_engine.plugin_env import switch

logger = logging.getLogger("vllm.pdx_plugin")

ENV = "PDX_ASCENDING_BLOCKS"
MODULE = "vllm.v1.core.block_pool"
_MARK = "_pdx_ascending_blocks"


def enabled_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    return switch(ENV, True, "1 (blocks in ascending order) or 0 (vLLM's order)", environ)


def by_id(blocks: list[Any]) -> list[Any]:
    """``blocks`` in ascending ``block_id`` order (the same list when already so)."""
    ids = [b.block_id for b in blocks]
    if all(a < b for a, b in itertools.pairwise(ids)):
        return blocks
    return sorted(blocks, key=lambda b: b.block_id)


def _ascending(get_new_blocks: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    @functools.wraps(get_new_blocks)
    def wrapper(self: Any, num_blocks: int) -> list[Any]:
        return by_id(get_new_blocks(self, num_blocks))

    setattr(wrapper, _MARK, True)
    return wrapper


def patch(pool_class: type) -> bool:
    """Make ``pool_class.get_new_blocks`` return its blocks by id; False if it already does."""
    current = pool_class.get_new_blocks  # type: ignore[attr-defined]
    if getattr(current, _MARK, False):
        return False
    pool_class.get_new_blocks = _ascending(current)  # type: ignore[attr-defined]
    return True


def patch_module(module: ModuleType) -> None:
    pool_class = getattr(module, "BlockPool", None)
    if pool_class is None or not callable(getattr(pool_class, "get_new_blocks", None)):
        logger.error("pdx plugin: this vLLM has no BlockPool.get_new_blocks; KV blocks keep vLLM's order")
        return
    if patch(pool_class):
        logger.info("pdx plugin: KV blocks are handed out in ascending order (NIXL merges their runs)")


def register() -> None:
    """Entry point (``vllm.general_plugins``); safe to call repeatedly."""
    if not enabled_from_env():
        return
    if not module_exists(MODULE):
        logger.error("pdx plugin: this vLLM has no %s; KV blocks keep vLLM's order", MODULE)
        return
    on_import(MODULE, patch_module)
