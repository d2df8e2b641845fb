"""Decode's stream through the relay (pdx_router.relay) whatever way the socket delivers it."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import orjson
import pytest

from .conftest import StackFactory
from .helpers import user

EVENTS = (
    b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"},'
    b'"finish_reason":null}]}\n\n',
    b"data: [DONE]\n\n",
)


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


async def serve_chats(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    answer: Callable[[asyncio.StreamWriter], Awaitable[None]],
) -> None:
    """A fake decode's connection: each chat POST answered by `answer`, anything else 404 (the
    router reuses connections: its health checks' calls come first)."""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            break
        length = head.split(b"Content-Length: ", 1)[1].split(b"\r\n", 1)[0] if b"Content-Length: " in head else b"0"
        await reader.readexactly(int(length))
        if not head.startswith(b"POST /v1/chat/completions "):
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            continue
        await answer(writer)
    writer.close()


@pytest.fixture
async def decode_in_one_write() -> AsyncIterator[str]:
    """A decode engine whose whole streamed answer (status line, headers, events, the end)
    leaves in one write, so the router reads all of it at once."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def whole(w: asyncio.StreamWriter) -> None:
            w.write(STREAM_HEAD + chunked(*EVENTS))
            await w.drain()

        await serve_chats(reader, writer, whole)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    server.close()


async def test_a_stream_read_whole_in_one_read_is_relayed_whole(
    make_stack: StackFactory, decode_in_one_write: str
) -> None:
    s = await make_stack(decode=(decode_in_one_write,))
    body = {"model": "Qwen", "messages": [user("hello")], "stream": True}
    timeout = aiohttp.ClientTimeout(total=5)
    url = s.url + "/v1/chat/completions"
    async with aiohttp.ClientSession(timeout=timeout) as http, http.post(url, json=body) as r:
        got = await r.read()
    assert r.status == 200 and got == b"".join(EVENTS)


async def test_a_turn_whose_client_leaves_once_its_answer_began_is_still_counted(
    make_stack: StackFactory,
) -> None:
    """An agent that closes its connection right after [DONE] (or mid-answer) cancels the router's
    handler; the turn was served as decided, so its outcome counts in the stats and metrics."""
    s = await make_stack(decode_opts={"token_delay": 0.2})
    body = {"model": "Qwen", "messages": [user("hello")], "stream": True, "max_tokens": 8}
    async with aiohttp.ClientSession() as http, http.post(s.url + "/v1/chat/completions", json=body) as r:
        async for line in r.content:
            if line.startswith(b"data:"):
                break  # the first token, then the client goes
    async with aiohttp.ClientSession() as http:
        for _ in range(100):
            async with http.get(s.url + "/v1/pdx/stats") as got:
                counted = sum((await got.json())["reuse"].values())
            if counted:
                break
            await asyncio.sleep(0.02)
    assert counted == 1


async def test_a_turn_whose_client_closes_as_the_streams_end_comes_is_still_counted(
    make_stack: StackFactory,
) -> None:
    """A client reads [DONE] (the relay writes it from decode's callback) and closes at once. When
    its close and decode's end of stream reach the router in one poll, the handler writes the end
    to a socket already closing (ConnectionResetError) before it can be cancelled. The turn was
    served as decided: it counts."""
    client: list[asyncio.StreamWriter] = []
    done_seen = asyncio.Event()

    async def end_as_the_client_closes(w: asyncio.StreamWriter) -> None:
        w.write(STREAM_HEAD + chunked(*EVENTS)[: -len(b"0\r\n\r\n")])
        await done_seen.wait()
        # The end of decode's stream, then the client's close, both before the router's
        # loop polls again (this loop is the router's: block it until both have arrived).
        w.write(b"0\r\n\r\n")
        client[0].get_extra_info("socket").shutdown(socket.SHUT_RDWR)  # the FIN leaves now
        time.sleep(0.05)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_chats(reader, writer, end_as_the_client_closes)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    decode = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    s = await make_stack(decode=(decode,))
    host, port = s.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    client.append(writer)
    payload = orjson.dumps({"model": "Qwen", "messages": [user("hello")], "stream": True})
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    await reader.readuntil(b"data: [DONE]")
    done_seen.set()
    async with aiohttp.ClientSession() as http:
        for _ in range(100):
            async with http.get(s.url + "/v1/pdx/stats") as got:
                counted = sum((await got.json())["reuse"].values())
            if counted:
                break
            await asyncio.sleep(0.02)
    server.close()
    assert counted == 1
