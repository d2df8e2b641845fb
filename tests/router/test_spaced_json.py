"""End to end: engines whose JSON is re-serialized with spaces (valid JSON, vLLM's content)
still give reuse, and the client never sees the ids or kv the router asked for."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from .conftest import Stack, StackFactory
from .helpers import LONG, assistant, user

SPACED = {"spaced_json": True}


async def _spaced_stack(make_stack: StackFactory) -> Stack:
    return await make_stack(prefill_opts=SPACED, decode_opts=SPACED)


async def _post(
    http: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any]
) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The answer's JSON documents: the one object, or every SSE event's (parsed, in order)."""
    async with http.post(url + path, json=body) as r:
        assert r.status == 200, await r.read()
        raw = await r.read()
        headers = dict(r.headers)
    if not body.get("stream"):
        return headers, [json.loads(raw)]
    events = [ln[5:].strip() for ln in raw.splitlines() if ln.startswith(b"data:")]
    assert events[-1] == b"[DONE]"
    return headers, [json.loads(e) for e in events[:-1]]


def _text(docs: list[dict[str, Any]]) -> str:
    out = ""
    for d in docs:
        for c in d["choices"]:
            out += (c.get("message") or c.get("delta") or {}).get("content") or c.get("text") or ""
    return out.strip()


def _internals(docs: list[dict[str, Any]]) -> list[str]:
    """The router's own fields that reached the client, wherever they sit."""
    found = []
    for d in docs:
        holders = [d, *d.get("choices", [])]
        found += [k for h in holders for k in ("token_ids", "prompt_token_ids", "kv_transfer_params") if k in h]
    return found


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_spaced_engines_reuse_a_chat_and_hide_the_routers_fields(
    make_stack: StackFactory, http: aiohttp.ClientSession, stream: bool
) -> None:
    s = await _spaced_stack(make_stack)
    msgs = [user(LONG)]
    body: dict[str, Any] = {"model": "Qwen", "messages": msgs, "stream": stream, "conversation_id": "c"}
    headers, docs = await _post(http, s.url, "/v1/chat/completions", body)
    assert headers["X-PDX-Reuse"] == "miss"
    assert _internals(docs) == []
    assert s.decode.requests[-1][1]["return_token_ids"] is True  # the router did ask for them
    msgs += [assistant(_text(docs)), user("and then?")]
    headers, docs = await _post(http, s.url, "/v1/chat/completions", {**body, "messages": msgs})
    assert headers["X-PDX-Reuse"] == "hit"
    assert int(headers["X-PDX-Reused-Tokens"]) > 80
    assert [r.correct for r in s.cluster.reads] == [True]
    assert _internals(docs) == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_spaced_engines_reuse_a_completion_and_hide_the_routers_fields(
    make_stack: StackFactory, http: aiohttp.ClientSession, stream: bool
) -> None:
    s = await _spaced_stack(make_stack)
    body: dict[str, Any] = {"model": "Qwen", "prompt": LONG, "stream": stream, "conversation_id": "k", "max_tokens": 8}
    headers, docs = await _post(http, s.url, "/v1/completions", body)
    assert headers["X-PDX-Reuse"] == "miss"
    assert _internals(docs) == []
    body["prompt"] = LONG + " " + _text(docs) + " next question"
    headers, docs = await _post(http, s.url, "/v1/completions", body)
    assert headers["X-PDX-Reuse"] == "hit"
    assert s.cluster.reads and all(r.correct for r in s.cluster.reads)
    assert _internals(docs) == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_spaced_engines_keep_the_ids_a_client_asked_for(
    make_stack: StackFactory, http: aiohttp.ClientSession, stream: bool
) -> None:
    s = await _spaced_stack(make_stack)
    body: dict[str, Any] = {
        "model": "Qwen",
        "messages": [user(LONG)],
        "stream": stream,
        "conversation_id": "c",
        "return_token_ids": True,
    }
    _, docs = await _post(http, s.url, "/v1/chat/completions", body)
    fields = _internals(docs)
    assert "token_ids" in fields and "prompt_token_ids" in fields
    assert "kv_transfer_params" not in fields
    # the turn was still captured: the next one reuses
    body["messages"] = [user(LONG), assistant(_text(docs)), user("more")]
    headers, _ = await _post(http, s.url, "/v1/chat/completions", body)
    assert headers["X-PDX-Reuse"] == "hit"


@pytest.mark.parametrize("spaced", [False, True], ids=["compact", "spaced"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_without_a_conversation_the_client_gets_its_ids_but_never_kv(
    make_stack: StackFactory, http: aiohttp.ClientSession, stream: bool, spaced: bool
) -> None:
    opts = SPACED if spaced else {}
    s = await make_stack(prefill_opts=opts, decode_opts=opts)
    body: dict[str, Any] = {"model": "Qwen", "messages": [user(LONG)], "stream": stream, "return_token_ids": True}
    _, docs = await _post(http, s.url, "/v1/chat/completions", body)
    fields = _internals(docs)
    assert "token_ids" in fields and "kv_transfer_params" not in fields
