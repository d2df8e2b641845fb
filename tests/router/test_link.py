"""The engine-hop HTTP client against hand-written answers, on asyncio's loop and uvloop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from pdx_router.link import Link, LinkError

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

LOOPS: list[Any] = [asyncio.new_event_loop]
try:
    import uvloop

    LOOPS.append(uvloop.new_event_loop)
except ImportError:  # pragma: no cover
    pass


def run(loop_factory: Any, coro: Any) -> Any:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(asyncio.wait_for(coro, 10))


async def read_request(r: asyncio.StreamReader) -> bytes:
    head = await r.readuntil(b"\r\n\r\n")
    n = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return head + await r.readexactly(n)


class Server:
    """Answers each request on a connection with the next canned answer."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed_by_client = asyncio.Event()

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                try:
                    self.requests.append(await read_request(r))
                except asyncio.IncompleteReadError:
                    self.closed_by_client.set()
                    return
                await self.answers.pop(0)(r, w)
                if w.is_closing():
                    return
            await r.read()
            self.closed_by_client.set()
        finally:
            w.close()

    async def __aenter__(self) -> str:
        self.srv = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.srv.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *_: object) -> None:
        self.srv.close()


def send(data: bytes, close: bool = False) -> Answer:
    async def answer(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(data)
        await w.drain()
        if close:
            w.close()

    return answer


def chunked(*parts: bytes, trailer: bytes = b"") -> Answer:
    async def answer(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n")
        wire = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n" + trailer + b"\r\n"
        for i in range(0, len(wire), 7):  # split anywhere, even inside size lines
            w.write(wire[i : i + 7])
            await w.drain()
            await asyncio.sleep(0)

    return answer


def json_ok(body: bytes) -> Answer:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    return send(head + body)


@pytest.mark.parametrize("loop", LOOPS)
def test_content_length_answers_reuse_one_connection(loop: Any) -> None:
    async def main() -> None:
        srv = Server(json_ok(b'{"a":1}'), json_ok(b'{"b":2}'))
        async with srv as url:
            link = Link(5)
            for want in (b'{"a":1}', b'{"b":2}'):
                async with link.post(url, "/x", b"{}", {"Authorization": "Bearer k"}) as resp:
                    assert resp.status == 200 and resp.content_type == "application/json"
                    assert await resp.read() == want
            await link.close()
        assert srv.connections == 1
        assert srv.requests[0].startswith(b"POST /x HTTP/1.1\r\nHost: 127.0.0.1:")
        assert b"\r\nAuthorization: Bearer k\r\n" in srv.requests[0]

    run(loop, main())


@pytest.mark.parametrize("loop", LOOPS)
def test_chunked_stream_is_dechunked_whatever_the_split(loop: Any) -> None:
    async def main() -> None:
        parts = [b"data: {}\n\n", b"x" * 300, b"data: [DONE]\n\n"]
        srv = Server(chunked(*parts, trailer=b"X-T: 1\r\n"), json_ok(b"{}"))
        async with srv as url:
            link = Link(5)
            async with link.post(url, "/s", b"{}", {}) as resp:
                got = b"".join([b async for b in resp.iter_blocks()])
            assert got == b"".join(parts)
            async with link.post(url, "/x", b"{}", {}) as resp:  # still in sync after the trailer
                assert await resp.read() == b"{}"
            await link.close()
        assert srv.connections == 1

    run(loop, main())


@pytest.mark.parametrize("loop", LOOPS)
def test_close_delimited_body_and_connection_close_are_not_reused(loop: Any) -> None:
    async def main() -> None:
        srv = Server(send(b"HTTP/1.1 500 Oops\r\nContent-Type: text/plain\r\n\r\nbroken", close=True))
        async with srv as url:
            link = Link(5)
            async with link.post(url, "/x", b"{}", {}) as resp:
                assert resp.status == 500 and await resp.read() == b"broken"
        srv2 = Server(send(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"), json_ok(b"{}"))
        async with srv2 as url:
            for _ in range(2):
                async with link.post(url, "/x", b"{}", {}) as resp:
                    assert await resp.read() == b"{}"
            await link.close()
        assert srv2.connections == 2

    run(loop, main())


@pytest.mark.parametrize("loop", LOOPS)
def test_an_idle_connection_the_engine_closed_is_not_used(loop: Any) -> None:
    async def main() -> None:
        srv = Server(send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", close=True), json_ok(b"{}"))
        async with srv as url:
            link = Link(5)
            async with link.post(url, "/x", b"{}", {}) as resp:
                assert await resp.read() == b"{}"
            await asyncio.sleep(0.05)  # the engine's keep-alive timeout closed it meanwhile
            async with link.post(url, "/x", b"{}", {}) as resp:
                assert await resp.read() == b"{}"
            await link.close()
        assert srv.connections == 2

    run(loop, main())


@pytest.mark.parametrize("loop", LOOPS)
def test_failures_are_link_errors_or_timeouts(loop: Any) -> None:
    async def never(_r: asyncio.StreamReader, _w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)

    async def main() -> None:
        link = Link(0.2)
        async with Server(never) as url:
            with pytest.raises(TimeoutError):
                async with link.post(url, "/x", b"{}", {}) as resp:
                    await resp.read()
        await link.close()
        link = Link(5)  # a loaded test machine must not turn the next cases into timeouts
        async with Server(send(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", close=True)) as url:
            with pytest.raises(LinkError):
                async with link.post(url, "/x", b"{}", {}) as resp:
                    await resp.read()
        with pytest.raises(LinkError):
            async with link.post(url, "/x", b"{}", {}):
                pass  # nothing listens any more
        await link.close()

    run(loop, main())


@pytest.mark.parametrize("loop", LOOPS)
def test_leaving_a_stream_early_closes_the_connection(loop: Any) -> None:
    async def endless(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(100):
            w.write(b"6\r\ndata: \r\n")
            try:
                if await asyncio.wait_for(r.read(1), 0.01) == b"":
                    srv.closed_by_client.set()  # what a real engine takes as "abort"
                    return
            except TimeoutError:
                pass

    srv = Server(endless)

    async def main() -> None:
        async with srv as url:
            link = Link(5)
            async with link.post(url, "/s", b"{}", {}) as resp:
                async for _ in resp.iter_blocks():
                    break
            await asyncio.wait_for(srv.closed_by_client.wait(), 2)
            await link.close()

    run(loop, main())
