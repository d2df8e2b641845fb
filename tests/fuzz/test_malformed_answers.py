"""Whatever bytes an engine answers with, the client of pdx-router gets a served turn, the
engine's own 4xx, or a 502 naming the engine's role and what was wrong: never a 500, a
traceback, an unhandled error in the log, or a router field."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.router.conftest import Stack, StackFactory

from . import gen_http, gen_sse, sse
from .draw import Draw, HypothesisDraw
from .profiles import fuzz
from .raw_engine import RawEngine

CHAT = "/v1/chat/completions"
NAMED = (  # what a client may read of a failed engine: the role and what was wrong, nothing of the engine
    "the prefill engine's answer was malformed",
    "the prefill engine failed",
    "the decode engine's answer was malformed",
    "the decode engine failed",
    "the decode engine's stream was malformed: ",
    "the decode engine's stream broke off",
)
NO_PAIR = "no healthy prefill/decode pair of one generation"


@pytest.fixture
async def engines(make_stack: StackFactory) -> AsyncIterator[tuple[Stack, RawEngine, RawEngine]]:
    """Two routers' worth in one stack: the first's prefill is raw, the second's decode."""
    raw_p, raw_d = RawEngine(), RawEngine()
    await raw_p.start()
    await raw_d.start()
    s = await make_stack(conversation_from="id")
    bad_p = await make_stack(prefill=(raw_p.url,), decode=tuple(s.decode_urls), conversation_from="id")
    bad_d = await make_stack(prefill=tuple(s.prefill_urls), decode=(raw_d.url,), conversation_from="id")
    s.router_urls[:] = [bad_p.url, bad_d.url]
    yield s, raw_p, raw_d
    await raw_p.close()
    await raw_d.close()


def _answer(d: Draw, stream: bool) -> bytes:
    """An engine's answer: a generated HTTP answer, or a well-framed one whose body is an
    event stream or JSON object, mutated some of the time."""
    if d.chance(0.4):
        return gen_http.stream(d, one=True, answers=True)
    events = gen_sse.events(d)
    if stream:
        body, kind = gen_sse.sse(d, events), b"text/event-stream"
    else:
        body, kind = orjson.dumps({"id": "x", "choices": [e["choices"] for e in events][:1] or [], **events[-1]}), (
            b"application/json"
        )
    raw = b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (kind, len(body), body)
    return gen_http.mutate(d, raw) if d.chance(0.5) else raw


def _check(status: int, body: bytes, stream: bool, logged: list[logging.LogRecord]) -> None:
    assert not [r for r in logged if r.levelno >= logging.ERROR], [r.getMessage() for r in logged]
    assert b"Traceback" not in body and status != 500, body[:300]
    if status in (502, 503):  # 503: failed twice as unreachable, the engine is out of the pool
        message = orjson.loads(body)["error"]["message"]
        assert message.startswith(NAMED if status == 502 else NO_PAIR), message
    elif status == 200 and stream:
        for data in sse.events(body):
            value = sse.parsed(data)
            assert not sse.router_fields(value, strip_ids=True), data[:300]
            error = value.get("error") if isinstance(value, dict) else None
            assert error is None or str(error.get("message")).startswith(NAMED), error
    elif status == 200:
        assert not sse.router_fields(sse.parsed(body), strip_ids=True), body[:300]
    else:
        assert 400 <= status < 500, (status, body[:300])  # the engine's own 4xx, passed on


@fuzz(300)
@given(data=st.data())
async def test_any_engine_answer_gives_a_turn_an_engine_4xx_or_a_named_502(
    engines: tuple[Stack, RawEngine, RawEngine], http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture,
    data: st.DataObject,
) -> None:  # fmt: skip
    s, raw_p, raw_d = engines
    d = HypothesisDraw(data)
    hop = d.choice((0, 1))  # the prefill's answer or the decode's
    stream = d.chance(0.5) and hop == 1
    (raw_p if hop == 0 else raw_d).answer = _answer(d, stream)
    for router in s.routers:  # (an engine that failed as unreachable is out of the pool until checked)
        for ep in router.pool.endpoints:
            ep.healthy = True
    caplog.clear()
    body = {"model": "Qwen", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    async with http.post(s.router_urls[hop] + CHAT, json=body) as r:
        status, got = r.status, await r.read()
    _check(status, got, stream, caplog.records)
