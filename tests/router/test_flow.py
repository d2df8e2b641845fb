"""The reference protocol end to end against fake engines."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from pdx_router.entries import Entry
from pdx_router.policy.shapes import FRESH_PREFILL_KV

from .conftest import StackFactory
from .helpers import LONG, assistant, chat, stream_text, user


async def test_first_turn_is_plain_pd_with_fresh_prefill_params(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack()
    status, headers, data = await chat(http, s.url, [user(LONG)])
    assert status == 200
    assert headers["X-PDX-Reuse"] == "miss"
    path, pbody = s.prefill.requests[-1]
    assert path == "/v1/chat/completions"
    assert pbody["kv_transfer_params"] == FRESH_PREFILL_KV
    assert pbody["max_tokens"] == 1 and pbody["max_completion_tokens"] == 1
    assert pbody["stream"] is False and "conversation_id" not in pbody
    _, dbody = s.decode.requests[-1]
    assert dbody["kv_transfer_params"]["do_remote_prefill"] is True
    assert dbody["kv_transfer_params"]["remote_engine_id"] == "prefill-0"
    assert dbody["return_token_ids"] is True
    assert "kv_transfer_params" not in data
    assert "prompt_token_ids" not in data and "token_ids" not in data["choices"][0]


async def test_second_turn_reuses_decode_blocks_exactly(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack()
    msgs = [user(LONG)]
    _, _, data = await chat(http, s.url, msgs)
    msgs += [assistant(data["choices"][0]["message"]["content"]), user("and then?")]
    status, headers, _ = await chat(http, s.url, msgs)
    assert status == 200
    assert headers["X-PDX-Reuse"] == "hit"
    assert int(headers["X-PDX-Reused-Tokens"]) > 80
    assert [r.correct for r in s.cluster.reads] == [True]
    kv = s.prefill.requests[-1][1]["kv_transfer_params"]
    assert kv["remote_engine_id"] == "decode-0" and kv["do_remote_decode"] is True
    assert kv["do_remote_prefill"] is False
    stats = await (await http.get(s.url + "/v1/pdx/stats")).json()
    assert stats["reuse"]["hit"] == 1 and stats["reuse"]["miss"] == 1
    assert stats["reusedTokens"] == int(headers["X-PDX-Reused-Tokens"])
    assert stats["interTurnGapSeconds"]["count"] == 1


async def test_streamed_turns_strip_internals_and_still_reuse(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack()
    msgs = [user(LONG)]
    status, headers, lines = await chat(http, s.url, msgs, stream=True)
    assert status == 200 and lines[-1] == b"data: [DONE]"
    for ln in lines:
        assert b"token_ids" not in ln and b"kv_transfer_params" not in ln
    text = stream_text(lines)
    assert text.strip()
    msgs += [assistant(text.strip()), user("more")]
    status, headers, lines = await chat(http, s.url, msgs, stream=True)
    assert headers["X-PDX-Reuse"] == "hit"
    assert all(r.correct for r in s.cluster.reads) and s.cluster.reads


async def test_client_asking_for_token_ids_keeps_them(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack()
    _, _, data = await chat(http, s.url, [user(LONG)], return_token_ids=True)
    assert data["prompt_token_ids"] and data["choices"][0]["token_ids"]
    assert "kv_transfer_params" not in data
    _, _, lines = await chat(http, s.url, [user(LONG)], conversation="c2", stream=True, return_token_ids=True)
    assert any(b'"token_ids"' in ln for ln in lines)
    assert not any(b"kv_transfer_params" in ln for ln in lines)


async def test_a_reused_chat_turn_prefills_the_compared_ids_and_decode_renders_the_chat(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    """Prefill gets the ids the prefix check used (no second render and tokenization there);
    decode gets the chat, and no ids in kv_transfer_params, which vLLM would ignore."""
    s = await make_stack()
    msgs = [user(LONG)]
    _, _, data = await chat(http, s.url, msgs, cache_salt="tenant-a", temperature=0.7)
    msgs += [assistant(data["choices"][0]["message"]["content"]), user("and then?")]
    _, headers, _ = await chat(http, s.url, msgs, cache_salt="tenant-a", temperature=0.7)
    assert headers["X-PDX-Reuse"] == "hit"
    path, pbody = s.prefill.requests[-1]
    tokenized = [b for p, b in s.prefill.requests if p == "/tokenize"][-1]
    assert path == "/v1/completions"
    assert pbody["prompt"] == s.cluster.chat_ids({"messages": tokenized["messages"]})
    assert pbody["max_tokens"] == 1 and "temperature" not in pbody
    assert pbody["kv_transfer_params"]["remote_engine_id"] == "decode-0"
    dpath, dbody = s.decode.requests[-1]
    assert dpath == "/v1/chat/completions" and dbody["messages"] == msgs
    # the client's salt, folded into its tenant's (cacheIsolation: tenant), reaches both engines alike
    assert pbody["cache_salt"] == dbody["cache_salt"] not in (None, "tenant-a")
    assert "prompt" not in dbody and "prompt_token_ids" not in dbody["kv_transfer_params"]
    assert s.cluster.reads[-1].correct


async def test_a_reused_chat_turn_with_tools_prefills_as_chat(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    """Tools may render differently under engine flags the router cannot see: prefill renders
    the chat itself, as decode will."""
    s = await make_stack()
    tools = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
    msgs = [user(LONG)]
    _, _, data = await chat(http, s.url, msgs, tools=tools)
    msgs += [assistant(data["choices"][0]["message"]["content"]), user("and then?")]
    _, headers, _ = await chat(http, s.url, msgs, tools=tools)
    assert headers["X-PDX-Reuse"] == "hit"
    path, pbody = s.prefill.requests[-1]
    assert path == "/v1/chat/completions" and pbody["tools"] == tools and "prompt" not in pbody
    assert s.cluster.reads[-1].correct


async def test_tokenize_disagreeing_with_the_chat_render_drops_the_entry(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(prefill_opts={"tokenize_differs": True})
    msgs = [user(LONG)]
    outcomes = []
    for question in ("first", "second", "third"):
        status, headers, data = await chat(http, s.url, msgs)
        assert status == 200
        outcomes.append(headers["X-PDX-Reuse"])
        msgs += [assistant(data["choices"][0]["message"]["content"]), user(question)]
    # turn 2 was planned on /tokenize's ids, decode reported others: nothing is kept from it
    assert outcomes == ["miss", "hit", "miss"]
    metrics = await (await http.get(s.url + "/metrics")).text()
    assert "pdx_router_tokenize_mismatch_total 1.0" in metrics
    stats = await (await http.get(s.url + "/v1/pdx/stats")).json()
    assert stats["tokenizeMismatch"] == 1


async def test_completions_endpoint_reuses_with_token_prompt(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack()
    body = {"model": "Qwen", "prompt": LONG, "conversation_id": "k", "max_tokens": 8}
    async with http.post(s.url + "/v1/completions", json=body) as r:
        first = orjson.loads(await r.read())
        assert r.headers["X-PDX-Reuse"] == "miss"
    assert "token_ids" not in first["choices"][0]
    body["prompt"] = LONG + " " + first["choices"][0]["text"] + " next question"
    async with http.post(s.url + "/v1/completions", json=body) as r:
        assert r.status == 200
        assert r.headers["X-PDX-Reuse"] == "hit"
    assert s.cluster.reads and all(r.correct for r in s.cluster.reads)
    # prefill and decode got the exact ids the prefix check compared
    assert isinstance(s.prefill.requests[-1][1]["prompt"], list)
    assert s.decode.requests[-1][1]["prompt"] == s.prefill.requests[-1][1]["prompt"]


async def test_with_ids_only_no_conversation_id_means_no_store(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(conversation_from="id")
    _, headers, _ = await chat(http, s.url, [user(LONG)], conversation=None)
    assert headers["X-PDX-Reuse"] == "none"
    assert "return_token_ids" not in s.decode.requests[-1][1]
    stats = await (await http.get(s.url + "/v1/pdx/stats")).json()
    assert stats["entries"] == 0


async def test_session_header_names_the_conversation(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack()
    msgs = [user(LONG)]
    _, _, data = await chat(http, s.url, msgs, conversation=None, headers={"X-Session-ID": "s9"})
    msgs += [assistant(data["choices"][0]["message"]["content"]), user("x")]
    _, headers, _ = await chat(http, s.url, msgs, conversation=None, headers={"X-Session-ID": "s9"})
    assert headers["X-PDX-Reuse"] == "hit"


async def test_the_next_turn_sent_the_moment_a_stream_ends_finds_the_entry(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    """An agent sends turn N+1 as soon as it reads [DONE]; the entry must be stored before that."""
    import asyncio

    s = await make_stack()
    store = s.router.store
    real_put = store.put

    async def slow_put(key: str, entry: Entry, head: str | None = None, length: int = 0) -> None:
        await asyncio.sleep(0.3)  # e.g. a Redis round trip on a busy node
        await real_put(key, entry, head, length)

    store.put = slow_put  # type: ignore[method-assign]
    msgs = [user(LONG)]
    _, _, lines = await chat(http, s.url, msgs, stream=True)
    msgs += [assistant(stream_text(lines).strip()), user("next, at once")]
    # Another connection: on the same keep-alive one the server would wait for the handler.
    async with aiohttp.ClientSession() as other:
        status, headers, _ = await chat(other, s.url, msgs, stream=True)
    assert status == 200
    assert headers["X-PDX-Reuse"] == "hit"


async def test_debug_log_shows_each_hops_kv_transfer_params(
    make_stack: StackFactory, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG", logger="pdx_router")
    s = await make_stack()
    msgs = [user(LONG)]
    _, _, data = await chat(http, s.url, msgs)
    msgs += [assistant(data["choices"][0]["message"]["content"]), user("and then?")]
    await chat(http, s.url, msgs)
    lines = [r.getMessage() for r in caplog.records]
    hops = [m.split(" kv_transfer_params=") for m in lines if "kv_transfer_params=" in m]
    assert [h[0].rsplit(" ", 1)[0] for h in hops] == ["to prefill", "to decode", "from decode"] * 2
    sent = [orjson.loads(h[1]) for h in hops]
    assert sent[0] == FRESH_PREFILL_KV
    assert sent[3]["remote_engine_id"] == "decode-0"  # turn 2's prefill reads decode's blocks
    assert sent[3]["remote_num_tokens"] <= sent[2]["remote_num_tokens"]
