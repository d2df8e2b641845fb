"""Several router replicas share conversation entries through Redis."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import replace

import aiohttp
import orjson
import pytest
import redis.asyncio as redis

from pdx_router.chat_tokens import TextPrefix
from pdx_router.config import StoreConfig
from pdx_router.entries import Entry
from pdx_router.ids import of_list, to_list
from pdx_router.store import MemoryStore, RedisStore, Store

from .conftest import StackFactory
from .helpers import LONG, assistant, chat, user

pytestmark = pytest.mark.redis


async def test_second_turn_on_another_router_reuses_the_entry(
    make_stack: StackFactory, http: aiohttp.ClientSession, redis_url: str
) -> None:
    s = await make_stack(routers=2, store=StoreConfig(kind="redis", url=redis_url, key_prefix="pdx-test-a:"))
    msgs = [user(LONG)]
    _, h1, data = await chat(http, s.router_urls[0], msgs)
    assert h1["X-PDX-Reuse"] == "miss"
    msgs += [assistant(data["choices"][0]["message"]["content"]), user("next")]
    _, h2, _ = await chat(http, s.router_urls[1], msgs)
    assert h2["X-PDX-Reuse"] == "hit"
    assert [r.correct for r in s.cluster.reads] == [True]
    # single use: the same turn replayed on the first router finds nothing
    _, h3, _ = await chat(http, s.router_urls[0], msgs, conversation="c1")
    assert h3["X-PDX-Reuse"] in ("hit", "miss")
    assert len(s.cluster.reads) == 1 + (h3["X-PDX-Reuse"] == "hit")


async def test_redis_store_is_bounded_and_single_use(redis_url: str) -> None:
    store = RedisStore(redis_url, "pdx-test-b:", max_entries=2)
    e = Entry({"remote_num_tokens": 1}, of_list([1]), "http://d", "g", 1e10, 1e10 + 5)
    try:
        for k in ("a", "b", "c"):
            await store.put(k, replace(e, deadline=e.deadline + ord(k)))
        assert await store.count() == 2
        assert await store.take("a") is None  # the one closest to its deadline was dropped
        got = await store.take("c")
        assert got is not None and to_list(got.token_ids) == [1]
        assert await store.take("c") is None
    finally:
        await store.close()


async def test_an_entry_keeps_where_the_routers_tokenizer_resumes_through_redis(redis_url: str) -> None:
    store = RedisStore(redis_url, "pdx-test-c:", max_entries=10)
    ids = of_list([1, 2, 3])
    e = Entry({"remote_num_tokens": 3}, ids, "http://d", "g", 1e10, 1e10 + 5, 16, TextPrefix(40, "ab12", 2))
    try:
        await store.put("k", e)
        assert await store.take("k") == e
        await store.put("k", replace(e, prefix=None))
        got = await store.take("k")
        assert got is not None and got.prefix is None
    finally:
        await store.close()


def _entry(n: int, seed: int, tenant: str = "", deadline: float | None = None) -> Entry:
    """An entry of n ids; the later the seed, the later its deadline (Redis orders by it)."""
    rng = random.Random(seed)
    ids = of_list([0, 2**32 - 1, *(rng.randrange(100_000, 150_000) for _ in range(n - 2))])  # one size
    kv = {"remote_num_tokens": n, "remote_block_ids": [list(range(n // 16))], "remote_engine_id": "d"}
    return Entry(kv, ids, "http://d", "g", 1e10, deadline or 1e10 + seed, 16, tenant=tenant)


async def test_ids_round_trip_through_redis_as_their_text(redis_url: str) -> None:
    store = RedisStore(redis_url, "pdx-test-d:", max_entries=10)
    e = _entry(16384, 1, tenant="acme")
    raw = redis.Redis.from_url(redis_url)
    try:
        await store.put("k", e)
        value = await raw.get("pdx-test-d:k")
        # the ids' text after a header (kv and all) in JSON: 7 bytes an id of 6 digits
        assert len(e.token_ids) < 7 * 16384
        assert value is not None and len(value) < len(e.token_ids) + len(orjson.dumps(e.kv)) + 256
        got = await store.take("k")
        assert got == e and to_list(got.token_ids)[:2] == [0, 2**32 - 1]
    finally:
        await raw.aclose()
        await store.close()


async def test_an_entry_in_the_json_form_of_earlier_routers_is_still_read(redis_url: str) -> None:
    """Routers are upgraded while Redis holds their entries (this form is main's today)."""
    store = RedisStore(redis_url, "pdx-test-e:", max_entries=10)
    raw = redis.Redis.from_url(redis_url)
    old = {"kv": {"remote_num_tokens": 3}, "t": [5, 6, 7], "d": "http://d", "g": "g", "s": 1.0, "x": 2.0, "b": 16}
    try:
        await raw.set("pdx-test-e:k", orjson.dumps({**old, "p": None}))
        got = await store.take("k")
        assert got is not None and to_list(got.token_ids) == [5, 6, 7] and got.block_size == 16
    finally:
        await raw.aclose()
        await store.close()


async def test_the_redis_store_holds_its_byte_bound_and_each_tenants_share(redis_url: str) -> None:
    one = len(_entry(1000, 0, tenant="mallory").to_bytes())
    store = RedisStore(redis_url, "pdx-test-f:", max_entries=1000, max_bytes=8 * one, max_bytes_per_tenant=4 * one)
    try:
        for i in range(2):
            await store.put(f"victim{i}", _entry(1000, i, tenant="victim"))
        for i in range(50):  # the flood: far beyond the whole store
            await store.put(f"flood{i}", _entry(1000, 100 + i, tenant="mallory"))
            assert await store.nbytes() <= 8 * one
        assert await store.count() == 2 + 4
        assert all([await store.take(f"victim{i}") is not None for i in range(2)])
        assert await store.take("flood49") is not None and await store.take("flood45") is None
        for i in range(10):  # many tenants: the whole store's bound, the oldest first
            await store.put(f"t{i}", _entry(1000, 200 + i, tenant=f"t{i}"))
        assert await store.count() == 8 and await store.nbytes() <= 8 * one
        assert await store.take("t1") is None and await store.take("t9") is not None
    finally:
        await store.close()


async def test_the_redis_stores_bytes_follow_take_and_expiry(redis_url: str) -> None:
    store = RedisStore(redis_url, "pdx-test-g:", max_entries=10, max_bytes=10**9, grace=0.0)
    try:
        await store.put("a", _entry(100, 1, tenant="x"))
        await store.put("a", _entry(100, 2, tenant="x"))  # replaced, counted once
        assert await store.nbytes() == len(_entry(100, 2, tenant="x").to_bytes())
        assert await store.take("a") is not None and await store.nbytes() == 0
        await store.put("b", _entry(100, 3, tenant="x", deadline=time.time() + 0.05))
        assert await store.nbytes() > 0
        await asyncio.sleep(0.1)
        assert await store.nbytes() == 0 and await store.count() == 0
    finally:
        await store.close()


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_both_stores_count_the_live_entries_a_decode_holds_of_one_generation(redis_url: str, kind: str) -> None:
    """What a draining decode waits for: taken, expired or other-generation entries are not."""
    store: Store = RedisStore(redis_url, "pdx-test-hold:", max_entries=10) if kind == "redis" else MemoryStore(10)
    now = time.time()
    e = Entry({"remote_num_tokens": 1}, of_list([1]), "http://d1", "g", now, now + 60)
    try:
        await store.put("a", e)
        await store.put("b", e)
        await store.put("c", replace(e, decode_url="http://d2"))
        await store.put("d", replace(e, generation="old"))
        await store.put("e", replace(e, deadline=now - 1))  # past its deadline, within the grace
        assert await store.holding("http://d1", "g") == 2
        await store.take("a")
        assert await store.holding("http://d1", "g") == 1
        assert await store.holding("http://d2", "g") == 1 and await store.holding("http://d1", "old") == 1
        assert await store.holding("http://d9", "g") == 0
    finally:
        await store.close()


async def test_take_first_takes_the_first_key_that_holds_an_entry_once(redis_url: str) -> None:
    """A history's keys, longest first: one atomic step, so two forks never both get it."""
    e = Entry({"remote_num_tokens": 1}, of_list([1]), "http://d", "g", 1e10, 1e10 + 5, tenant="t")
    stores: list[Store] = [MemoryStore(10), RedisStore(redis_url, "pdx-test-first:", max_entries=10)]
    for store in stores:
        try:
            await store.put("short", e)
            await store.put("long", replace(e, token_ids=of_list([1, 2])))
            got = await store.take_first(["missing", "long", "short"])
            assert got is not None and to_list(got.token_ids) == [1, 2]
            got = await store.take_first(["missing", "long", "short"])
            assert got is not None and to_list(got.token_ids) == [1]
            assert await store.take_first(["long", "short"]) is None
            assert await store.count() == 0
        finally:
            await store.close()
