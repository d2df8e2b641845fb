"""Stored conversations cost the router a bounded amount of memory: compact ids, a byte bound
for the store, and a share per tenant that no other tenant's traffic can take."""

from __future__ import annotations

import random
import tracemalloc
from dataclasses import replace

import aiohttp
import orjson

from pdx_contract.router_config import TenancyConfig
from pdx_router.config import StoreConfig
from pdx_router.endpoints import Endpoint
from pdx_router.entries import Entry
from pdx_router.ids import count, of_list
from pdx_router.policy import Outcome
from pdx_router.policy.reuse import make_entry, plan_reuse
from pdx_router.store import MemoryStore

from .conftest import StackFactory
from .helpers import LONG, assistant, chat, user

DECODE = Endpoint(url="http://d0", role="decode", generation="g1", block_size=16)


def kv_for(n: int, block_size: int = 16) -> dict[str, object]:
    return {
        "do_remote_prefill": False,
        "do_remote_decode": True,
        "remote_block_ids": [list(range(1000, 1000 + -(-n // block_size)))],
        "remote_engine_id": "decode-0",
        "remote_request_id": "r",
        "remote_host": "10.0.0.2",
        "remote_port": 5700,
        "remote_num_tokens": n,
        "remote_blocks_expiry_time": 9.0,
    }


def stored(ids: list[int], tenant: str = "", deadline: float = 1e12) -> Entry:
    """The entry a finished turn leaves: decode holds all of `ids` (the last one generated)."""
    e = make_entry(kv_for(len(ids)), of_list(ids[:-1]), ids[-1:], DECODE, 0.0, deadline)
    assert e is not None
    return replace(e, tenant=tenant) if tenant else e


def random_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 150_000) for _ in range(n)]


async def test_a_stored_16k_token_conversation_costs_a_few_bytes_a_token() -> None:
    n, k = 16384, 24
    answers = [orjson.dumps(random_ids(n, i)) for i in range(k)]
    store = MemoryStore(max_entries=1000)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, answer in enumerate(answers):  # the ids as decode's answer gives them: new ints
            await store.put(f"k{i}", stored(orjson.loads(answer)))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    per_token = held / (n * k)
    assert per_token < 10, per_token  # the ids' text (~6.5 bytes here); a list of ints: ~40 bytes a token
    estimate = await store.nbytes() / (n * k)
    assert 0.8 * per_token <= estimate <= 1.25 * per_token, (estimate, per_token)


def test_the_prefix_check_on_compact_ids_is_exact_wherever_the_prompt_diverges() -> None:
    n = 5000
    held = random_ids(n, 1)
    entry = stored(held)
    assert count(entry.token_ids) == n
    for at in (0, 1, 31, 32, 33, 255, 256, 257, 2047, 2500, n - 2, n - 1, n):
        prompt = [*held[:at], *([held[at] + 1] if at < n else []), *random_ids(40, at)]
        plan = plan_reuse(entry, of_list(prompt), threshold=1)
        expected = min(at, len(prompt) - 1)
        if expected >= 1:
            assert plan.outcome is Outcome.HIT and plan.tokens == expected, at
        else:
            assert plan.outcome is not Outcome.HIT, at
    # an id of more digits, or one that is the start of the held one, is still another id
    for odd in (2**32, 2**40, held[100] * 10, held[100] // 10):
        prompt = [*held[:100], odd, *held[101:]]
        plan = plan_reuse(entry, of_list(prompt), threshold=1)
        assert plan.outcome is Outcome.HIT and plan.tokens == 100, odd


def test_decode_ids_no_token_can_have_leave_nothing_to_store() -> None:
    assert make_entry(kv_for(3), of_list([1]), [-5, 2], DECODE, 0.0, 450.0) is None
    assert make_entry(kv_for(3), None, [1, 2], DECODE, 0.0, 450.0) is None  # decode's prompt ids unreadable


async def test_the_memory_store_holds_its_byte_bound_dropping_the_oldest_first() -> None:
    one = stored(random_ids(1000, 0)).nbytes()
    store = MemoryStore(max_entries=1000, max_bytes=5 * one + one // 2)
    for i in range(20):
        await store.put(f"k{i}", stored(random_ids(1000, i), tenant=f"t{i}"))
        assert await store.nbytes() <= 5 * one + one // 2
    assert await store.count() == 5
    assert [await store.take(f"k{i}") is not None for i in range(20)] == [False] * 15 + [True] * 5
    assert await store.nbytes() == 0 and await store.count() == 0


async def test_one_tenant_flooding_the_memory_store_drops_only_its_own_entries() -> None:
    one = stored(random_ids(1000, 0), tenant="mallory").nbytes()  # each entry's estimate, ids of one size
    store = MemoryStore(max_entries=1000, max_bytes=40 * one, max_bytes_per_tenant=10 * one)
    for i in range(3):
        await store.put(f"victim{i}", stored(random_ids(1000, i), tenant="victim"))
    for i in range(500):
        await store.put(f"flood{i}", stored(random_ids(1000, 100 + i), tenant="mallory"))
    assert await store.count() == 3 + 10  # mallory keeps its share, its newest entries
    assert all([await store.take(f"victim{i}") is not None for i in range(3)])
    assert await store.take("flood499") is not None and await store.take("flood489") is None


async def test_an_entry_larger_than_a_tenants_share_is_not_kept_and_evicts_nothing() -> None:
    small = stored(random_ids(100, 0), tenant="a")
    store = MemoryStore(max_entries=100, max_bytes=10 * small.nbytes(), max_bytes_per_tenant=2 * small.nbytes())
    await store.put("small", small)
    await store.put("huge", stored(random_ids(5000, 1), tenant="a"))
    assert await store.take("huge") is None and await store.take("small") == small


TOTAL, SHARE = 30_000, 15_000  # a stored turn of these tests: ~2 kB


async def test_a_tenants_entries_survive_another_tenant_flooding_the_router(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    """End to end: each API key is a tenant, and the router bounds each one's share. The
    flood is more than the whole store holds: by age alone, alice's entry would go first."""
    s = await make_stack(
        store=StoreConfig(max_bytes=TOTAL, max_bytes_per_tenant=SHARE), tenancy=TenancyConfig(identity="apiKey")
    )
    alice = {"Authorization": "Bearer alice"}
    msgs = [user(LONG)]
    _, _, data = await chat(http, s.url, msgs, conversation="mine", headers=alice)
    for i in range(40):
        mallory = {"Authorization": "Bearer mallory"}
        status, _, _ = await chat(http, s.url, [user(f"{LONG} {i}")], conversation=f"f{i}", headers=mallory)
        assert status == 200
    async with http.get(s.url + "/v1/pdx/stats") as r:
        stats = await r.json()
    assert 0 < stats["storeBytes"] <= SHARE + 4000 and stats["entries"] < 40
    msgs += [assistant(data["choices"][0]["message"]["content"]), user("next")]
    _, headers, _ = await chat(http, s.url, msgs, conversation="mine", headers=alice)
    assert headers["X-PDX-Reuse"] == "hit"
