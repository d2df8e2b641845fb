"""The fault suite, bounds: clients that send slowly or open too many connections.

The router runs as `pdx-router` runs it (main.serve, on a loopback port) in front of fake
engines; the clients are raw sockets, so a request can stop anywhere. Each case checks that
the slow or surplus connection is ended with the status that names why, and that other
clients are served meanwhile. The figures go to the suite's tally.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from pdx.local.topology import free_port
from pdx_router.config import RouterConfig
from pdx_router.main import serve
from tests.faults.tally import TALLY
from tests.router.conftest import StackFactory
from tests.router.helpers import chat, stream_text, user

pytestmark = pytest.mark.faults

Serve = Callable[..., Awaitable[str]]
PARTIAL = b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\n"
Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@pytest.fixture
async def served(make_stack: StackFactory) -> AsyncIterator[Serve]:
    """A router served by main.serve in front of one fake prefill and decode; its URL."""
    tasks: list[asyncio.Task[None]] = []

    async def start(decode_opts: dict[str, Any] | None = None, **cfg: Any) -> str:
        s = await make_stack(routers=0, decode_opts=decode_opts)
        port = free_port()
        settings: dict[str, Any] = {
            "served_model_name": "Qwen",
            "generation": "g1",
            "health_check_interval_seconds": 60,
        }
        config = RouterConfig(
            host="127.0.0.1", port=port, prefill=tuple(s.prefill_urls), decode=tuple(s.decode_urls), **settings, **cfg
        )
        tasks.append(asyncio.create_task(serve(config)))
        for _ in range(100):
            with contextlib.suppress(OSError):
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                break
            await asyncio.sleep(0.05)
        return f"http://127.0.0.1:{port}"

    yield start
    for t in tasks:
        t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await t
    gc.unfreeze()  # serve() froze everything allocated so far


def _record(name: str, survived: bool) -> None:
    TALLY.injected.append(name)
    if survived:
        TALLY.survived.append(name)


async def _open(url: str, first: bytes = b"") -> Conn:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    if first:
        writer.write(first)
    return reader, writer


async def _ending(reader: asyncio.StreamReader, within: float) -> bytes | None:
    """What the router sends before it closes the connection, or None if it stays open."""
    try:
        return await asyncio.wait_for(reader.read(), within)
    except TimeoutError:
        return None


async def _metrics(http: aiohttp.ClientSession, url: str) -> bytes:
    async with http.get(url + "/metrics") as r:
        return await r.read()


async def _served(http: aiohttp.ClientSession, url: str) -> bool:
    TALLY.turns += 1
    status, _, lines = await chat(http, url, [user("hi")], conversation=None, stream=True)
    ok = status == 200 and lines[-1] == b"data: [DONE]" and bool(stream_text(lines))
    TALLY.lost += not ok
    return ok


async def test_slow_header_senders_are_closed_while_others_are_served(
    served: Serve, http: aiohttp.ClientSession
) -> None:
    url = await served(header_timeout_seconds=1.0)
    slow = [await _open(url, PARTIAL) for _ in range(60)]
    t0 = time.monotonic()
    served_meanwhile = []
    while time.monotonic() - t0 < 1.5:
        if time.monotonic() - t0 < 0.75:  # a header line every 0.25 s: never a whole request
            for _, w in slow:  # (not past the timeout: a write to a closed socket resets it)
                w.write(b"X-Slow: 1\r\n")
        served_meanwhile.append(await _served(http, url))
        await asyncio.sleep(0.25)
    endings = [await _ending(r, 1.0) for r, _ in slow]
    for _, w in slow:
        w.close()
    closed = [e for e in endings if e is not None]
    _record("60 clients sending headers a line at a time", len(closed) == 60 and all(served_meanwhile))
    assert len(closed) == 60, f"{60 - len(closed)} of 60 slow connections still open after the header timeout"
    assert all(e.startswith(b"HTTP/1.1 408 ") for e in closed)
    assert all(served_meanwhile) and len(served_meanwhile) >= 3
    assert b'pdx_router_connections_closed_total{reason="header_timeout"} 60.0' in await _metrics(http, url)


async def test_connections_above_the_cap_are_refused_until_some_close(
    served: Serve, http: aiohttp.ClientSession
) -> None:
    url = await served(max_connections=10, header_timeout_seconds=1.0)
    idle = [await _open(url) for _ in range(10)]
    await asyncio.sleep(0.1)
    extra, _ = await _open(url)
    refused = await _ending(extra, 0.5)
    assert refused is not None and refused.startswith(b"HTTP/1.1 503 "), refused
    # the idle ones send nothing: the header timeout ends them, and the router serves again
    assert [await _ending(r, 2.0) is not None for r, _ in idle] == [True] * 10
    ok = await _served(http, url)
    for _, w in idle:
        w.close()
    shown = await _metrics(http, url)
    assert b'pdx_router_connections_closed_total{reason="max_connections"} 1.0' in shown
    assert b"pdx_router_open_connections 1.0" in shown  # this scrape's own
    _record("connections above maxConnections", ok)
    assert ok


async def test_a_body_sent_too_slowly_gets_408_that_closes_the_connection(served: Serve) -> None:
    url = await served(body_timeout_seconds=0.5)
    head = PARTIAL + b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    reader, writer = await _open(url, head + b'{"model": "Qwen", ')
    answer = b""
    t0 = time.monotonic()
    with contextlib.suppress(TimeoutError):
        answer = await asyncio.wait_for(reader.readuntil(b"(0.5 s)"), 3.0)
    took = time.monotonic() - t0
    writer.close()
    ok = answer.startswith(b"HTTP/1.1 408 ") and b"Connection: close" in answer
    _record("a request body sent too slowly", ok)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"bodyTimeoutSeconds" in answer, answer
    assert b"Connection: close" in answer and 0.4 < took < 2.0


async def test_a_stream_to_a_slow_reader_outlives_the_request_timeouts(served: Serve) -> None:
    # Both request timeouts far below the answer's length: only reading the request is timed.
    url = await served(
        decode_opts={"token_delay": 0.1, "output_tokens": 12}, header_timeout_seconds=0.3, body_timeout_seconds=0.3
    )
    body = {"model": "Qwen", "messages": [user("hi")], "stream": True}
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as http, http.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        raw = b""
        async for block in r.content.iter_any():
            raw += block
            await asyncio.sleep(0.1)  # a reader slower than the engine
    TALLY.turns += 1
    assert time.monotonic() - t0 > 1.0 and raw.rstrip().endswith(b"data: [DONE]"), raw[-200:]


async def test_a_kept_alive_connection_idle_past_the_header_timeout_serves_its_next_request(served: Serve) -> None:
    url = await served(header_timeout_seconds=0.3)
    reader, writer = await _open(url)
    answers = []
    for _ in range(2):
        writer.write(b"GET /health HTTP/1.1\r\nHost: router\r\n\r\n")
        answers.append(await asyncio.wait_for(reader.readuntil(b'{"status":"ok"}'), 2.0))
        await asyncio.sleep(0.8)  # idle, between requests: the keep-alive's time, not the header timeout
    writer.close()
    assert all(a.startswith(b"HTTP/1.1 200 ") for a in answers)
