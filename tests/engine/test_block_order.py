"""The ascending-blocks plugin: vLLM's block pool hands a request its blocks by id, which is what
lets NIXL merge a transfer's pairs (checked here on the real NIXL and the real block pool)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from pdx_engine import block_order


@dataclass
class Block:
    block_id: int


class Pool:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def get_new_blocks(self, num_blocks: int) -> list[Any]:
        return [Block(i) for i in self.ids[:num_blocks]]


def test_a_pools_blocks_come_out_by_id_and_the_same_blocks_are_taken() -> None:
    class Patched(Pool):
        pass

    assert block_order.patch(Patched)
    got = Patched([9, 8, 7, 3, 4]).get_new_blocks(4)
    assert [b.block_id for b in got] == [3, 7, 8, 9]


def test_patching_twice_keeps_one_wrapper() -> None:
    class Patched(Pool):
        pass

    assert block_order.patch(Patched) and not block_order.patch(Patched)
    assert [b.block_id for b in Patched([2, 1]).get_new_blocks(2)] == [1, 2]


def test_blocks_already_in_order_are_returned_as_they_are() -> None:
    blocks = [Block(1), Block(5), Block(6)]
    assert block_order.by_id(blocks) is blocks
    assert block_order.by_id([]) == []


def test_the_switch_is_on_unless_set_to_0_and_a_bad_value_names_the_variable() -> None:
    assert block_order.enabled_from_env({})
    assert block_order.enabled_from_env({block_order.ENV: "1"})
    assert not block_order.enabled_from_env({block_order.ENV: "0"})
    with pytest.raises(ValueError, match="PDX_ASCENDING_BLOCKS='yes': expected 1"):
        block_order.enabled_from_env({block_order.ENV: "yes"})


def test_vllms_own_pool_hands_out_reused_blocks_downwards_and_patched_upwards(monkeypatch: pytest.MonkeyPatch) -> None:
    pool_module = pytest.importorskip("vllm.v1.core.block_pool")
    # vLLM's own method, even where an earlier test's import of vLLM loaded pdx's plugins (which
    # patch BlockPool for the rest of the process); the original comes back after this test
    own = pool_module.BlockPool.get_new_blocks
    if getattr(own, block_order._MARK, False):
        own = own.__wrapped__
    monkeypatch.setattr(pool_module.BlockPool, "get_new_blocks", own)

    def reused(enable_caching: bool) -> list[int]:
        pool = pool_module.BlockPool(num_gpu_blocks=32, enable_caching=enable_caching, hash_block_size=16)
        first = pool.get_new_blocks(8)
        pool.free_blocks(reversed(first))  # how vLLM's KV cache managers free a request: tail first
        return [b.block_id for b in pool.get_new_blocks(8)]

    for caching in (False, True):
        before = reused(caching)
        assert before != sorted(before), before  # what the plugin is for: vLLM reuses them downwards
    block_order.patch_module(pool_module)
    for caching in (False, True):
        after = reused(caching)
        assert after == sorted(after) and sorted(after) == sorted(before), after


def _nixl_copies(ascending: bool) -> tuple[int, bool]:
    """One READ of 12 blocks in each of 4 regions between two real NIXL agents (DRAM, UCX): how
    many copies NIXL made of it, and whether every block arrived where it was asked to."""
    api = pytest.importorskip("nixl._api")
    config = api.nixl_agent_config(backends=["UCX"], capture_telemetry=True)
    tag = f"{int(ascending)}-{time.monotonic_ns()}"
    reader, holder = api.nixl_agent(f"reader-{tag}", config), api.nixl_agent(f"holder-{tag}", config)
    regions, blocks, words = 4, 32, 256  # 1 KiB blocks
    held = np.arange(regions * blocks * words, dtype=np.int32)
    local = np.zeros_like(held)
    reader.register_memory(reader.get_reg_descs([(local.ctypes.data, local.nbytes, 0, "")], "DRAM"))
    holder.register_memory(holder.get_reg_descs([(held.ctypes.data, held.nbytes, 0, "")], "DRAM"))
    reader.add_remote_agent(holder.get_agent_metadata())

    def descs(base: int) -> Any:
        step = words * 4
        rows = [(base + (r * blocks + b) * step, step, 0) for r in range(regions) for b in range(blocks)]
        return reader.get_xfer_descs(np.array(rows, dtype=np.uint64), "DRAM")

    mine = reader.prep_xfer_dlist("NIXL_INIT_AGENT", descs(local.ctypes.data))
    theirs = reader.prep_xfer_dlist(holder.name, descs(held.ctypes.data))
    local_ids, remote_ids = list(range(3, 15)), list(range(20, 8, -1))  # vLLM's order: one side downwards
    if ascending:
        local_ids, remote_ids = list(range(3, 15)), list(range(9, 21))
    pairs = [
        (r * blocks + lb, r * blocks + rb) for r in range(regions) for lb, rb in zip(local_ids, remote_ids, strict=True)
    ]
    handle = reader.make_prepped_xfer("READ", mine, [p[0] for p in pairs], theirs, [p[1] for p in pairs], b"done")
    assert reader.transfer(handle) in ("DONE", "PROC")
    deadline = time.monotonic() + 10
    while reader.check_xfer_state(handle) == "PROC" and time.monotonic() < deadline:
        time.sleep(0.001)
    assert reader.check_xfer_state(handle) == "DONE"
    copies = reader.get_xfer_telemetry(handle).descCount
    grid_local, grid_held = local.reshape(regions, blocks, words), held.reshape(regions, blocks, words)
    arrived = all(
        np.array_equal(grid_local[r, lb], grid_held[r, rb])
        for r in range(regions)
        for lb, rb in zip(local_ids, remote_ids, strict=True)
    )
    reader.release_xfer_handle(handle)
    return copies, arrived


def test_nixl_moves_ascending_runs_as_one_copy_per_region_and_a_downward_run_block_by_block() -> None:
    assert _nixl_copies(ascending=False) == (4 * 12, True)
    assert _nixl_copies(ascending=True) == (4, True)
