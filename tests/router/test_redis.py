"""Several router replicas share conversation entries through Redis."""

from __future__ import annotations

from dataclasses import replace

import aiohttp
import pytest

from pdx_router.chat_tokens import TextPrefix
from pdx_router.config import StoreConfig
from pdx_router.entries import Entry, pack_ids
from pdx_router.store import RedisStore

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
    e = Entry({"remote_num_tokens": 1}, pack_ids([1]), "http://d", "g", 1e10, 1e10 + 5)
    try:
        for k in ("a", "b", "c"):
            await store.put(k, replace(e, deadline=e.deadline + ord(k)))
        assert await store.count() == 2
        assert await store.take("a") is None  # the one closest to its deadline was dropped
        got = await store.take("c")
        assert got is not None and got.token_ids.tolist() == [1]
        assert await store.take("c") is None
    finally:
        await store.close()


async def test_an_entry_keeps_where_the_routers_tokenizer_resumes_through_redis(redis_url: str) -> None:
    store = RedisStore(redis_url, "pdx-test-c:", max_entries=10)
    ids = pack_ids([1, 2, 3])
    e = Entry({"remote_num_tokens": 3}, ids, "http://d", "g", 1e10, 1e10 + 5, 16, TextPrefix(40, "ab12", 2))
    try:
        await store.put("k", e)
        assert await store.take("k") == e
        await store.put("k", replace(e, prefix=None))
        got = await store.take("k")
        assert got is not None and got.prefix is None
    finally:
        await store.close()
