"""Reuse failing never fails the client: the turn is retried as plain P/D."""

from __future__ import annotations

import time

from pdx_router.policy import FRESH_PREFILL_KV

from .conftest import StackFactory
from .helpers import LONG, assistant, chat, stream_text, user


async def two_turns(s, http, **kw):  # type: ignore[no-untyped-def]
    msgs = [user(LONG)]
    _, _, data = await chat(http, s.url, msgs, **kw)
    text = stream_text(data).strip() if kw.get("stream") else data["choices"][0]["message"]["content"]
    msgs += [assistant(text), user("next")]
    return await chat(http, s.url, msgs, **kw)


async def test_declined_read_is_retried_without_reuse(make_stack: StackFactory, http) -> None:
    s = await make_stack(prefill_opts={"fail_reads": True})
    status, headers, data = await two_turns(s, http)
    assert status == 200 and data["choices"][0]["message"]["content"]
    assert headers["X-PDX-Reuse"] == "declined"
    assert headers["X-PDX-Reused-Tokens"] == "0"
    kvs = [b["kv_transfer_params"] for p, b in s.prefill.requests if p != "/tokenize"]
    assert kvs[-2]["remote_engine_id"] == "decode-0"  # the attempt with reuse
    assert kvs[-1] == FRESH_PREFILL_KV  # the retry
    stats = await (await http.get(s.url + "/v1/pdx/stats")).json()
    assert stats["reuse"]["declined"] == 1


async def test_streamed_declined_read_still_streams(make_stack: StackFactory, http) -> None:
    s = await make_stack(prefill_opts={"fail_reads": True})
    status, headers, lines = await two_turns(s, http, stream=True)
    assert status == 200 and lines[-1] == b"data: [DONE]"
    assert headers["X-PDX-Reuse"] == "declined"


async def test_entry_past_router_deadline_is_not_attached(make_stack: StackFactory, http) -> None:
    s = await make_stack(conversation_ttl_seconds=0.2)
    msgs = [user(LONG)]
    _, _, data = await chat(http, s.url, msgs)
    time.sleep(0.3)
    msgs += [assistant(data["choices"][0]["message"]["content"]), user("next")]
    status, headers, _ = await chat(http, s.url, msgs)
    assert status == 200 and headers["X-PDX-Reuse"] == "expired"
    assert s.prefill.requests[-1][1]["kv_transfer_params"] == FRESH_PREFILL_KV


async def test_decode_gone_means_no_reuse_and_other_decode(make_stack: StackFactory, http) -> None:
    s = await make_stack(n_decode=2)
    msgs = [user(LONG)]
    _, _, data = await chat(http, s.url, msgs)
    holder = next(d for d in s.decodes if d.requests)
    idx = s.decodes.index(holder)
    await s.runners[1 + idx].cleanup()  # runners: prefill, decode-0, decode-1, router
    msgs += [assistant(data["choices"][0]["message"]["content"]), user("next")]
    status, headers, data2 = await chat(http, s.url, msgs)
    assert status == 200 and data2["choices"][0]["message"]["content"]
    assert headers["X-PDX-Reuse"] == "expired"
    assert s.decodes[1 - idx].requests


async def test_prefill_client_errors_pass_through(make_stack: StackFactory, http) -> None:
    s = await make_stack()
    async with http.post(s.url + "/v1/chat/completions", json={"model": "Qwen"}) as r:
        # the fake prefill fails on a body without messages: 5xx -> 502 to the client
        assert r.status == 502
