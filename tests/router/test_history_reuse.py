"""Clients that send no conversation id reuse decode's KV: the router finds the conversation
from its history (policy/history.py), between the fake engines."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from pdx_contract.router_config import TenancyConfig
from pdx_router.config import StoreConfig

from .conftest import StackFactory
from .helpers import LONG, assistant, chat, stream_text, user

Messages = list[dict[str, Any]]


async def turn(
    http: aiohttp.ClientSession, url: str, msgs: Messages, stream: bool = False, **kw: Any
) -> tuple[str, dict[str, str], Messages]:
    """One turn without an id: the outcome, the headers, and the history with its answer."""
    status, headers, data = await chat(http, url, msgs, conversation=None, stream=stream, **kw)
    assert status == 200, data
    text = stream_text(data) if stream else data["choices"][0]["message"]["content"]
    return headers["X-PDX-Reuse"], headers, [*msgs, assistant(text)]


async def stats(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "/v1/pdx/stats") as r:
        out: dict[str, Any] = await r.json()
        return out


async def test_a_streamed_chat_loop_without_an_id_hits_on_turns_2_and_3(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack()
    msgs: Messages = [{"role": "system", "content": "terse"}, user(LONG)]
    outcomes = []
    for i in range(3):
        outcome, headers, msgs = await turn(http, s.url, msgs, stream=True)
        outcomes.append(outcome)
        assert headers["X-PDX-Found-By"] == "history"
        msgs.append(user(f"and then {i}"))
    assert outcomes == ["miss", "hit", "hit"]
    assert s.cluster.reads and all(r.correct for r in s.cluster.reads)
    found = (await stats(http, s.url))["foundBy"]
    assert found == {"id": 0, "header": 0, "history": 2}
    async with http.get(s.url + "/metrics") as r:
        assert 'pdx_router_conversations_found_total{by="history"} 2.0' in await r.text()


async def test_a_non_streamed_turn_2_hits(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack()
    _, _, msgs = await turn(http, s.url, [user(LONG)], stream=True)
    outcome, _, _ = await turn(http, s.url, [*msgs, user("more")])
    assert outcome == "hit" and all(r.correct for r in s.cluster.reads)


async def test_a_fork_reuses_once_and_keeps_both_branches(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack()
    _, _, msgs = await turn(http, s.url, [user(LONG)])
    first, _, a = await turn(http, s.url, [*msgs, user("branch a")])
    second, _, b = await turn(http, s.url, [*msgs, user("branch b")])
    assert (first, second) == ("hit", "miss")  # decode freed the blocks once read: plain P/D
    next_a, _, _ = await turn(http, s.url, [*a, user("a goes on")])
    next_b, _, _ = await turn(http, s.url, [*b, user("b goes on")])
    assert (next_a, next_b) == ("hit", "hit")
    assert len(s.cluster.reads) == 3 and all(r.correct for r in s.cluster.reads)


async def test_an_edited_assistant_message_misses(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack()
    _, _, msgs = await turn(http, s.url, [user(LONG)])
    msgs[-1] = assistant(msgs[-1]["content"] + " (edited)")
    outcome, _, _ = await turn(http, s.url, [*msgs, user("more")])
    assert outcome == "miss" and not s.cluster.reads


async def test_an_id_still_wins_when_sent(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack()
    _, _, data = await chat(http, s.url, [user(LONG)], conversation="c7")
    msgs = [user(LONG), assistant(data["choices"][0]["message"]["content"]), user("more")]
    _, headers, _ = await chat(http, s.url, msgs, conversation="c7")
    assert (headers["X-PDX-Reuse"], headers["X-PDX-Found-By"]) == ("hit", "id")


async def test_with_ids_only_a_history_finds_nothing(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack(conversation_from="id")
    _, _, data = await chat(http, s.url, [user(LONG)], conversation=None)
    msgs = [user(LONG), assistant(data["choices"][0]["message"]["content"]), user("more")]
    _, headers, _ = await chat(http, s.url, msgs, conversation=None)
    assert (headers["X-PDX-Reuse"], headers["X-PDX-Found-By"]) == ("none", "none")


async def test_with_history_only_an_id_is_ignored(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack(conversation_from="history")
    _, _, data = await chat(http, s.url, [user(LONG)], conversation="c8")
    msgs = [user(LONG), assistant(data["choices"][0]["message"]["content"]), user("more")]
    _, headers, _ = await chat(http, s.url, msgs, conversation="other")
    assert (headers["X-PDX-Reuse"], headers["X-PDX-Found-By"]) == ("hit", "history")


async def test_no_tenant_matches_another_tenants_history(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack(tenancy=TenancyConfig(identity="apiKey"))
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    _, _, msgs = await turn(http, s.url, [user(LONG)], headers=a)
    probe, _, _ = await turn(http, s.url, [*msgs, user("guess")], headers=b)
    assert probe == "miss" and not s.cluster.reads
    # the probe consumed nothing: the owner's next turn still reuses its entry
    owner, _, _ = await turn(http, s.url, [*msgs, user("mine")], headers=a)
    assert owner == "hit" and all(r.correct for r in s.cluster.reads)


async def test_a_client_without_an_identity_keeps_no_history(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(tenancy=TenancyConfig(identity="apiKey"))
    _, _, msgs = await turn(http, s.url, [user(LONG)])
    outcome, headers, _ = await turn(http, s.url, [*msgs, user("more")])
    assert (outcome, headers["X-PDX-Found-By"]) == ("none", "none")
    assert (await stats(http, s.url))["entries"] == 0


@pytest.mark.redis
async def test_router_replicas_share_histories_through_redis(
    make_stack: StackFactory, http: aiohttp.ClientSession, redis_url: str
) -> None:
    s = await make_stack(routers=2, store=StoreConfig(kind="redis", url=redis_url, key_prefix="pdx-test-hist:"))
    _, _, msgs = await turn(http, s.router_urls[0], [user(LONG)], stream=True)
    first, _, a = await turn(http, s.router_urls[1], [*msgs, user("on the other router")], stream=True)
    fork, _, _ = await turn(http, s.router_urls[0], [*msgs, user("a fork")])
    assert (first, fork) == ("hit", "miss")
    third, _, _ = await turn(http, s.router_urls[0], [*a, user("back again")])
    assert third == "hit" and len(s.cluster.reads) == 2 and all(r.correct for r in s.cluster.reads)


@pytest.mark.parametrize("kind", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def test_histories_count_in_the_byte_bound_and_one_tenants_share(
    make_stack: StackFactory, http: aiohttp.ClientSession, request: pytest.FixtureRequest, kind: str
) -> None:
    """A turn kept by its history is an ordinary entry: a tenant flooding the router with
    conversations without ids drops only its own, within its share."""
    share = 15_000  # a stored turn here: ~2 kB
    store = StoreConfig(max_bytes=30_000, max_bytes_per_tenant=share)
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        store = StoreConfig(
            kind="redis", url=url, key_prefix="pdx-test-hist-bound:", max_bytes=30_000, max_bytes_per_tenant=share
        )
    s = await make_stack(store=store, tenancy=TenancyConfig(identity="apiKey"))
    alice, mallory = {"Authorization": "Bearer alice"}, {"Authorization": "Bearer mallory"}
    _, _, msgs = await turn(http, s.url, [user(LONG)], headers=alice)
    for i in range(40):
        await turn(http, s.url, [user(f"{LONG} {i}")], headers=mallory)
    got = await stats(http, s.url)
    assert 0 < got["storeBytes"] <= share + 4000 and got["entries"] < 40
    outcome, _, _ = await turn(http, s.url, [*msgs, user("next")], headers=alice)
    assert outcome == "hit"


async def test_the_openai_sdks_chat_loop_reuses_without_any_change(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    """What a user writes with the `openai` package: no id, an API key, the answers appended."""
    openai = pytest.importorskip("openai")
    s = await make_stack(tenancy=TenancyConfig(identity="apiKey"))
    client = openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="sk-user", max_retries=0)
    msgs: list[Any] = [{"role": "system", "content": "terse"}, {"role": "user", "content": LONG}]
    try:
        for i in range(3):
            if i == 1:  # not streamed
                done = await client.chat.completions.create(model="Qwen", messages=msgs)
                text = done.choices[0].message.content or ""
            else:
                text = ""
                async for chunk in await client.chat.completions.create(model="Qwen", messages=msgs, stream=True):
                    text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
            msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": f"go on {i}"}]
    finally:
        await client.close()
    got = await stats(http, s.url)
    assert (got["reuse"]["hit"], got["foundBy"]["history"]) == (2, 2)
    assert all(r.correct for r in s.cluster.reads)


async def test_an_answer_sent_back_stripped_of_whitespace_still_hits(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack()
    _, _, msgs = await turn(http, s.url, [user(LONG)], stream=True)
    assert msgs[-1]["content"] != msgs[-1]["content"].strip()  # the fake's answers end in a space
    msgs[-1] = assistant(msgs[-1]["content"].strip())
    outcome, _, _ = await turn(http, s.url, [*msgs, user("more")])
    assert outcome == "hit" and all(r.correct for r in s.cluster.reads)


async def test_another_tenants_history_shows_a_prober_what_any_unknown_history_shows(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    """The oracle the issue rules out. B sends A's history word for word, and, beside it, an
    unknown history of its own of the same shape. With the reuse facts off (the default) both
    answers have one status and the same headers, the store is asked the same number of keys
    for each (the same work), the found counters do not move, and A's next turn still hits."""
    s = await make_stack(tenancy=TenancyConfig(identity="apiKey"), reuse_headers=False)
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    tried: list[int] = []
    store = s.router.store
    take, take_first = store.take, store.take_first

    async def counted_take(key: str) -> Any:
        tried.append(1)
        return await take(key)

    async def counted_take_first(keys: Any) -> Any:
        tried.append(len(keys))
        return await take_first(keys)

    store.take, store.take_first = counted_take, counted_take_first  # type: ignore[method-assign]
    status, _, data = await chat(http, s.url, [user(LONG)], conversation=None, headers=a)
    assert status == 200
    owned = [user(LONG), assistant(data["choices"][0]["message"]["content"]), user("more")]
    own_unknown = [user(LONG + " mine"), assistant("a guess at an answer"), user("more")]
    before = await stats(http, s.url)
    seen = []
    for msgs in (owned, own_unknown):
        tried.clear()
        status, headers, _ = await chat(http, s.url, msgs, conversation=None, headers=b)
        seen.append((status, sorted(k for k in headers if k not in ("Date", "X-Request-ID")), list(tried)))
    assert seen[0] == seen[1] and seen[0][0] == 200 and seen[0][2] == [1]
    assert not [k for k in seen[0][1] if k.lower().startswith("x-pdx-")]
    after = await stats(http, s.url)
    assert after["foundBy"] == before["foundBy"] and after["reuse"]["hit"] == before["reuse"]["hit"]
    assert after["reuse"]["miss"] == before["reuse"]["miss"] + 2 and not s.cluster.reads
    await chat(http, s.url, owned, conversation=None, headers=a)
    assert (await stats(http, s.url))["reuse"]["hit"] == 1 and all(r.correct for r in s.cluster.reads)
