"""Prefill's first token streamed to the client at once (router.firstTokenFromPrefill), between
the fake engines: the client reads exactly what decode alone would send, its first chunk leaves
before decode's hop, and what cannot take that path keeps the usual one."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import orjson
import pytest

from pdx_contract.first_token import ARG
from pdx_router.policy import first_token

from .conftest import Stack, StackFactory
from .helpers import LONG, assistant, chat, stream_text, user

Messages = list[dict[str, Any]]
CHECKS = {"checks_prefix": True}


async def streamed(
    http: aiohttp.ClientSession, s: Stack, msgs: Messages, **extra: Any
) -> tuple[str, list[bytes], float]:
    """A streamed turn: its outcome, its data lines, and seconds to the first content chunk."""
    body: dict[str, Any] = {"model": "Qwen", "messages": msgs, "stream": True, "conversation_id": "c1", **extra}
    t0 = time.perf_counter()
    first_at = None
    lines: list[bytes] = []
    async with http.post(s.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.read()
        outcome = r.headers["X-PDX-Reuse"]
        async for raw in r.content:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            lines.append(line)
            if first_at is None and line != b"data: [DONE]":
                delta = orjson.loads(line[6:])["choices"][0].get("delta", {})
                if delta.get("content"):
                    first_at = time.perf_counter() - t0
    assert first_at is not None
    return outcome, lines, first_at


def decode_bodies(s: Stack) -> list[dict[str, Any]]:
    return [b for p, b in s.decode.requests if p.startswith("/v1/") and p != "/v1/pdx/holds"]


async def test_a_streamed_conversation_reads_the_same_text_with_prefills_first_token(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    usual = await make_stack(prefill_opts=CHECKS, decode_opts=CHECKS)
    first = await make_stack(prefill_opts=CHECKS, decode_opts=CHECKS, first_token_from_prefill=True)
    runs: dict[str, tuple[list[str], list[str]]] = {}
    for name, s in (("usual", usual), ("first", first)):
        msgs: Messages = [user(LONG)]
        texts, outcomes = [], []
        for i in range(3):
            outcome, lines, _ = await streamed(http, s, msgs)
            assert lines[-1] == b"data: [DONE]"
            deltas = [orjson.loads(ln[6:])["choices"][0].get("delta", {}) for ln in lines[:-1]]
            assert sum("role" in d for d in deltas) == 1  # one role chunk: decode's own was cut
            texts.append(stream_text(lines))
            outcomes.append(outcome)
            msgs = [*msgs, assistant(texts[-1]), user(f"step {i} " + LONG)]
        runs[name] = texts, outcomes
    assert runs["first"] == runs["usual"]  # the same text turn for turn, and the history still found
    assert runs["first"][1] == ["miss", "hit", "hit"]
    assert all(ARG in b.get("vllm_xargs", {}) for b in decode_bodies(first))
    assert not any("vllm_xargs" in b for b in decode_bodies(usual))


async def test_the_first_chunk_leaves_before_decodes_first_token(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    slow = {**CHECKS, "first_token_delay": 0.4}  # decode's API, read and first step
    off = await make_stack(prefill_opts=CHECKS, decode_opts=slow)
    on = await make_stack(prefill_opts=CHECKS, decode_opts=slow, first_token_from_prefill=True)
    _, off_lines, off_first = await streamed(http, off, [user(LONG)])
    _, on_lines, on_first = await streamed(http, on, [user(LONG)])
    assert off_first >= 0.4 > on_first
    assert stream_text(on_lines) == stream_text(off_lines)


@pytest.mark.parametrize(
    "extra",
    [
        {"stream": False},
        {"n": 2},
        {"logprobs": True},
        {"seed": 7},
        {"max_tokens": 1},
        {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"},
        {"response_format": {"type": "json_object"}},
        {"return_token_ids": True},
    ],
    ids=["not-streamed", "n2", "logprobs", "seed", "one-token", "tools", "json", "ids"],
)
async def test_what_decodes_first_token_depends_on_keeps_the_usual_path(
    make_stack: StackFactory, http: aiohttp.ClientSession, extra: dict[str, Any]
) -> None:
    s = await make_stack(prefill_opts=CHECKS, decode_opts=CHECKS, first_token_from_prefill=True)
    status, _, _ = await chat(http, s.url, [user(LONG)], **{"stream": True, **extra})
    assert status == 200
    prefill = [b for p, b in s.prefill.requests if p.startswith("/v1/")]
    assert prefill and "return_token_ids" not in prefill[-1]
    assert all(ARG not in (b.get("vllm_xargs") or {}) for b in decode_bodies(s))


async def test_an_unreachable_decode_after_the_opening_is_replaced_and_starts_with_the_same_token(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(n_decode=2, prefill_opts=CHECKS, decode_opts=CHECKS, first_token_from_prefill=True)
    await s.runners[1].cleanup()  # decode-0, the least loaded and first: gone after the opening
    status, lines = await raw_stream(http, s)
    assert status == 200 and lines[-1] == b"data: [DONE]"
    words = stream_text(lines).split()
    assert len(words) == s.decodes[1].opts.output_tokens - 1  # the first word once, not twice
    forced = [b["vllm_xargs"][ARG] for p, b in s.decodes[1].requests if "vllm_xargs" in b]
    assert len(forced) == 1 and s.cluster.decode([forced[0]]) == words[0]


async def test_a_decode_failing_after_the_opening_ends_the_stream_with_an_error_and_no_done(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(prefill_opts=CHECKS, decode_opts={**CHECKS, "fail_status": 503}, first_token_from_prefill=True)
    status, lines = await raw_stream(http, s)
    assert status == 200  # the answer had begun with prefill's token
    assert b"[DONE]" not in lines[-1] and orjson.loads(lines[-1][6:])["error"]["code"] == 502
    assert len(stream_text(lines[:-1]).split()) == 1  # prefill's token, then the error


async def raw_stream(http: aiohttp.ClientSession, s: Stack) -> tuple[int, list[bytes]]:
    body = {"model": "Qwen", "messages": [user(LONG)], "stream": True}
    async with http.post(s.url + "/v1/chat/completions", json=body) as r:
        raw = await r.read()
        return r.status, [ln for ln in raw.split(b"\n") if ln.startswith(b"data: ")]


def test_the_cut_takes_the_first_tokens_text_whether_decode_sends_it_alone_or_folded() -> None:
    first = first_token.First(7, "Hel")

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return b"data: " + orjson.dumps({"id": "x", "choices": [choice]}) + b"\n\n"

    alone = first_token.Cut(first, True)
    out = alone.feed(event({"role": "assistant", "content": ""}) + event({"content": "Hel"}))
    assert out == b"" and alone.done
    assert alone.feed(event({"content": "lo"})) == event({"content": "lo"})  # untouched after
    folded = first_token.Cut(first, True)
    assert folded.feed(event({"role": "assistant", "content": ""})) == b""
    assert folded.feed(event({"content": "Hello"})) == event({"content": "lo"})
    split = first_token.Cut(first, True)
    assert split.feed(event({"role": "assistant", "content": ""}) + event({"content": "He"})) == b""
    assert split.feed(event({"content": "l"}) + event({"content": "p"})) == event({"content": "p"})
    ending = first_token.Cut(first, True)
    ending.feed(event({"role": "assistant", "content": ""}))
    assert ending.feed(event({"content": "Hel"}, "stop")) == event({"content": ""}, "stop")
    other = first_token.Cut(first, True)  # decode did not start with it (no forcing): passed as it came
    other.feed(event({"role": "assistant", "content": ""}))
    assert other.feed(event({"content": "Bye"})) == event({"content": "Bye"}) and other.mismatch


def test_prefills_answer_names_the_first_token_only_when_it_does_not_end_the_answer() -> None:
    def answer(finish: str, text: str, ids: Any = (5,)) -> dict[str, Any]:
        return {"choices": [{"message": {"content": text}, "finish_reason": finish, "token_ids": list(ids)}]}

    assert first_token.of_answer(answer("length", "Hi")) == first_token.First(5, "Hi")
    assert first_token.of_answer(answer("stop", "Hi")) is None  # end of text, or a stop string
    assert first_token.of_answer(answer("length", "")) is None  # part of a character
    assert first_token.of_answer(answer("length", "Hi", ())) is None  # no id named
    completion = {"choices": [{"text": " a", "finish_reason": "length", "token_ids": [9]}]}
    assert first_token.of_answer(completion) == first_token.First(9, " a")


async def test_a_streamed_completion_reads_the_same_text_with_prefills_first_token(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    texts = []
    for on in (False, True):
        s = await make_stack(prefill_opts=CHECKS, decode_opts=CHECKS, first_token_from_prefill=on)
        body = {"model": "Qwen", "prompt": LONG, "stream": True, "conversation_id": "p1"}
        async with http.post(s.url + "/v1/completions", json=body) as r:
            assert r.status == 200
            lines = [ln for ln in (await r.read()).split(b"\n") if ln.startswith(b"data: ")]
        assert lines[-1] == b"data: [DONE]"
        chunks = [orjson.loads(ln[6:]) for ln in lines[:-1]]
        texts.append("".join(c["choices"][0].get("text") or "" for c in chunks if c.get("choices")))
        assert (chunks[0]["id"] == "cmpl-" + r.headers["X-Request-ID"]) is on  # the opening is the router's
    assert texts[0] == texts[1] and texts[0]


async def test_a_fixed_answer_length_takes_the_path_and_prefill_may_not_end_at_its_token(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    """pdx bench and vLLM's benchmarks fix the answer's length (min_tokens = max_tokens)."""
    s = await make_stack(prefill_opts=CHECKS, decode_opts=CHECKS, first_token_from_prefill=True)
    _, lines, _ = await streamed(http, s, [user(LONG)], max_tokens=32, min_tokens=32)
    assert orjson.loads(lines[0][6:])["id"].startswith("chatcmpl-") and lines[-1] == b"data: [DONE]"
    [prefill] = [b for p, b in s.prefill.requests if p.startswith("/v1/")]
    assert prefill["min_tokens"] == 1 and prefill["max_tokens"] == 1 and prefill["return_token_ids"] is True
    [body] = decode_bodies(s)
    assert body["min_tokens"] == 32 and ARG in body["vllm_xargs"]
