"""The client-facing server (front.py) byte for byte: framing, bounds, keep-alive, streams."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
import pytest

from pdx_router.front import Answer, Request, Routes, Server, Stream, json_answer
from pdx_router.metrics import Metrics

Open = Callable[..., Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def _echo(req: Request) -> Answer:
    body = await req.read()
    return json_answer({"n": len(body), "head": body[:20].decode(), "q": req.query.get("q", "")})


async def _events(req: Request) -> Stream:
    out = Stream(200, {"Content-Type": "text/event-stream"})
    out.start(req)
    for i in range(3):
        out.write(b"data: %d\n\n" % i)
        await out.drain()
    out.end()
    return out


async def _broken(req: Request) -> Stream:
    out = Stream(200, {"Content-Type": "text/event-stream"})
    out.start(req)
    out.write(b"data: 0\n\n")
    raise RuntimeError("cut")


@pytest.fixture
async def server() -> AsyncIterator[tuple[Server, Open]]:
    routes = Routes()
    routes.add("POST", "/echo", _echo)
    routes.add("GET", "/events", _events)
    routes.add("GET", "/broken", _broken)
    srv = Server(routes, Metrics(), max_connections=8, header_timeout=0.5, max_body=1000)
    port = await srv.start("127.0.0.1", 0)
    writers: list[asyncio.StreamWriter] = []

    async def open_(first: bytes = b"") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        writers.append(w)
        if first:
            w.write(first)
        return r, w

    yield srv, open_
    for w in writers:
        w.close()
    await srv.close()


async def _answer(r: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One whole answer (Content-Length or chunked) off the stream."""
    head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 2.0)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    if "content-length" in headers:
        return status, headers, await r.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await r.readuntil(b"\r\n")).strip(), 16)
            body += (await r.readexactly(size + 2))[:-2]
            if not size:
                return status, headers, body
    return status, headers, await r.read()


def _post(body: bytes, extra: bytes = b"") -> bytes:
    return b"POST /echo?q=x HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def test_pipelined_requests_are_answered_in_order_on_one_connection(server: tuple[Server, Open]) -> None:
    _, open_ = server
    r, _ = await open_(_post(b"a" * 10) + _post(b"b" * 20) + b"GET /events HTTP/1.1\r\nHost: t\r\n\r\n")
    first, second, third = await _answer(r), await _answer(r), await _answer(r)
    assert (first[0], first[2]) == (200, b'{"n":10,"head":"aaaaaaaaaa","q":"x"}')
    assert second[2].startswith(b'{"n":20,')
    assert third[2] == b"data: 0\n\ndata: 1\n\ndata: 2\n\n" and third[1]["transfer-encoding"] == "chunked"


async def test_empty_lines_before_a_request_line_are_ignored(server: tuple[Server, Open]) -> None:
    _, open_ = server
    r, _ = await open_(_post(b"a") + b"\r\n" + _post(b"bb"))  # a CRLF after a body, as old clients send
    assert (await _answer(r))[2].startswith(b'{"n":1,') and (await _answer(r))[2].startswith(b'{"n":2,')


async def test_a_head_sent_a_byte_at_a_time_is_read_whole(server: tuple[Server, Open]) -> None:
    """Each read appends to one buffer and the search for the head's end resumes where it
    stopped (a slow sender costs time linear in what it sends, not quadratic)."""
    _, open_ = server
    raw = b"\r\n" + _post(b"abc", b"X-Pad: " + b"p" * 3000 + b"\r\n")
    r, w = await open_()
    for i in range(len(raw)):
        w.write(raw[i : i + 1])
        if i % 256 == 0:
            await w.drain()
            await asyncio.sleep(0)
    status, _, body = await _answer(r)
    assert status == 200 and body.startswith(b'{"n":3,')


async def test_a_chunked_request_body_is_read_whole_however_it_is_split(server: tuple[Server, Open]) -> None:
    _, open_ = server
    raw = _P + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n"
    r, w = await open_()
    for i in range(0, len(raw), 7):
        w.write(raw[i : i + 7])
        await w.drain()
        await asyncio.sleep(0.005)
    status, _, body = await _answer(r)
    assert status == 200 and body.startswith(b'{"n":11,"head":"hello world"')


_P = b"POST /echo HTTP/1.1\r\nHost: t\r\n"  # a request line and its Host: what follows is the case
_MANY = b"".join(b"X-%d: v\r\n" % i for i in range(100))  # 101 header lines with Host


@pytest.mark.parametrize(
    ("head", "status", "why"),
    [
        (_P + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc", 400, "Content-Length and Transfer"),
        (_P + b"Content-Length: +3\r\n\r\nabc", 400, "one decimal number"),
        (_P + b"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabc", 400, "one decimal number"),
        (_P + b"Transfer-Encoding: gzip, chunked\r\n\r\n", 501, "only Transfer-Encoding: chunked"),
        (b"POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "in an HTTP/1.0 request"),
        (_P + b"X-A: 1\r\n folded\r\nContent-Length: 0\r\n\r\n", 400, "folded lines are refused"),
        (_P + b"Bad Name: 1\r\n\r\n", 400, "not name: value"),
        (_P + b"X-A: a\x00b\r\n\r\n", 400, "control character"),
        (b"POST http://elsewhere/echo HTTP/1.1\r\nHost: t\r\n\r\n", 400, "origin form"),
        (b"POST /echo HTTP/2.0\r\n\r\n", 400, "not an HTTP/1.x request line"),
        (b"GET /events HTTP/1.1\r\nHost: t\r\nX-Long: " + b"y" * 9000 + b"\r\n\r\n", 431, "8190 bytes"),
        (_P + b"Content-Length: 5000\r\n\r\n", 413, "maxRequestBytes"),
        (_P + b"Transfer-Encoding: chunked\r\n\r\n7d0\r\n" + b"z" * 2000 + b"\r\n0\r\n\r\n", 413, "maxRequestBytes"),
        (_P + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400, "chunked framing is broken"),
        (b"GET /events HTTP/1.1\r\n\r\n", 400, "needs a Host header"),
        (_P + b"Host: elsewhere\r\n\r\n", 400, "Host header is sent 2 times; send it once"),
        (b"GET /events HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 400, "Host header is sent 2 times"),
        (_P + _MANY + b"\r\n", 431, "101 header lines, above 100; send fewer"),
        (b"GET /events HTTP/1.1\nHost: t\n\n", 400, "a bare CR or LF"),  # refused at once, not at 408
        (b"GET /events HTTP/1.1\r\nHost: t\rX: y\r\n\r\n", 400, "a bare CR or LF"),
        (b"GET /\xc3\xa9 HTTP/1.1\r\nHost: t\r\n\r\n", 400, "visible ASCII"),
        (_P + b"Content-Length: " + b"9" * 4400 + b"\r\n\r\n", 413, "maxRequestBytes"),  # int() would raise
        (_P + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\ngarbage\r\n\r\n", 400, "trailer"),
        (_P + b"Transfer-Encoding: chunked\r\n\r\n 5\r\nhello\r\n0\r\n\r\n", 400, "bad chunk size"),
    ],
)
async def test_a_request_framed_wrongly_is_refused_and_the_connection_closed(
    server: tuple[Server, Open], head: bytes, status: int, why: str
) -> None:
    _, open_ = server
    r, _ = await open_(head)
    got, headers, body = await _answer(r)
    assert got == status, body
    assert headers.get("connection") == "close" and b'"code":%d' % status in body
    assert why in orjson.loads(body)["error"]["message"]
    assert await asyncio.wait_for(r.read(), 2.0) == b""  # closed: nothing it sent next is read as a request


async def test_http_1_0_needs_no_host_and_100_header_lines_are_served(server: tuple[Server, Open]) -> None:
    """RFC 9112 §3.2 asks Host of HTTP/1.1 only; the count bound is 100 lines, Host among them."""
    _, open_ = server
    r, _ = await open_(b"POST /echo HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi")
    assert (await _answer(r))[2].startswith(b'{"n":2,')
    head = _post(b"ok", b"".join(b"X-%d: v\r\n" % i for i in range(98)))  # + Host, Content-Length
    assert head.count(b"\r\n") - 2 == 100  # the request line and the blank line are not headers
    r, _ = await open_(head)
    assert (await _answer(r))[0] == 200


@pytest.mark.parametrize(
    ("lines", "size", "status", "why"),
    [
        (100, 600, 200, ""),  # 100 lines of 600 bytes: within both bounds
        (101, 10, 431, "above 100"),  # many short lines: the count bound
        (100, 700, 431, "above 65536 bytes"),  # 100 long lines: the head's byte bound first
        (3, 8191, 431, "above 8190 bytes"),  # one line too long: the line bound first
    ],
)
async def test_the_count_line_and_head_bounds_each_refuse_what_only_they_catch(
    server: tuple[Server, Open], lines: int, size: int, status: int, why: str
) -> None:
    _, open_ = server
    pad = b"".join(b"X-%03d: " % i + b"v" * (size - 7) + b"\r\n" for i in range(lines - 2))
    r, _ = await open_(_post(b"ok", pad))  # + Host and Content-Length: `lines` header lines
    got, _, body = await _answer(r)
    assert got == status, body
    if why:
        assert why in orjson.loads(body)["error"]["message"]


async def test_a_request_pipelined_after_a_chunked_body_in_the_same_read_is_served(
    server: tuple[Server, Open],
) -> None:
    _, open_ = server
    chunked = _P + b"Transfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"
    r, _ = await open_(chunked + _post(b"abc"))
    assert (await _answer(r))[2].startswith(b'{"n":2,"head":"hi"')
    assert (await _answer(r))[2].startswith(b'{"n":3,"head":"abc"')


async def test_connection_options_are_tokens_so_closed_is_not_close(server: tuple[Server, Open]) -> None:
    _, open_ = server
    r, _ = await open_(_post(b"a", b"Connection: closed\r\n") + _post(b"b", b"Connection: keep-alive, close\r\n"))
    first, second = await _answer(r), await _answer(r)
    assert "connection" not in first[1] and second[1]["connection"] == "close"
    assert await asyncio.wait_for(r.read(), 2.0) == b""


async def test_expect_100_continue_gets_its_interim_answer(server: tuple[Server, Open]) -> None:
    _, open_ = server
    r, w = await open_(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    assert await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 2.0) == b"HTTP/1.1 100 Continue\r\n\r\n"
    w.write(b"abcd")
    assert (await _answer(r))[2].startswith(b'{"n":4,')


async def test_unknown_paths_are_404_and_wrong_methods_405_naming_the_allowed(server: tuple[Server, Open]) -> None:
    srv, open_ = server
    lines = (b"GET /nope", b"DELETE /echo", b"HEAD /events")
    r, _ = await open_(b"".join(b"%s HTTP/1.1\r\nHost: t\r\n\r\n" % line for line in lines))
    assert (await _answer(r))[0] == 404
    status, headers, _ = await _answer(r)
    assert status == 405 and headers["allow"] == "POST"
    head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 2.0)  # HEAD: the GET's head, no body
    assert head.startswith(b"HTTP/1.1 200 ") and b"chunked" in head
    count = [s for m in srv.metrics.requests.collect() for s in m.samples if s.name.endswith("_total")]
    assert {(s.labels["route"], s.labels["status"]): s.value for s in count} == {
        ("unmatched", "404"): 1, ("unmatched", "405"): 1, ("/events", "200"): 1
    }


async def test_a_stream_to_an_http_1_0_client_is_unframed_and_ends_with_the_connection(
    server: tuple[Server, Open],
) -> None:
    _, open_ = server
    r, _ = await open_(b"GET /events HTTP/1.0\r\n\r\n")
    status, headers, body = await _answer(r)
    assert status == 200 and "transfer-encoding" not in headers and body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


async def test_a_handler_that_fails_mid_stream_cuts_the_connection_without_an_end(
    server: tuple[Server, Open],
) -> None:
    _, open_ = server
    r, _ = await open_(b"GET /broken HTTP/1.1\r\nHost: t\r\n\r\n")
    await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 2.0)
    rest = await asyncio.wait_for(r.read(), 2.0)
    assert rest == b"9\r\ndata: 0\n\n\r\n"  # no last chunk: the client sees a cut stream, not a whole one


async def test_a_head_not_whole_within_the_header_timeout_gets_408(server: tuple[Server, Open]) -> None:
    _, open_ = server
    r, _ = await open_(b"POST /echo HTTP/1.1\r\nHost: t\r\n")
    answer = await asyncio.wait_for(r.read(), 2.0)
    assert answer.startswith(b"HTTP/1.1 408 ")
    r2, _ = await open_(_post(b"ok"))  # a prompt client on the same server is served
    assert (await _answer(r2))[0] == 200


async def test_connections_above_the_cap_get_503_and_the_gauge_counts_the_open_ones(
    server: tuple[Server, Open],
) -> None:
    srv, open_ = server
    held = [await open_() for _ in range(8)]
    await asyncio.sleep(0.05)
    r, _ = await open_()
    assert (await asyncio.wait_for(r.read(), 2.0)).startswith(b"HTTP/1.1 503 ")
    assert len(srv.open) == 8
    for _, w in held:
        w.close()
    for _ in range(50):
        if not srv.open:
            break
        await asyncio.sleep(0.02)
    assert not srv.open


async def test_a_client_that_leaves_cancels_its_handler(server: tuple[Server, Open]) -> None:
    srv, open_ = server
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def slow(_req: Request) -> Answer:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return json_answer({})

    srv.routes.add("GET", "/slow", slow)
    _, w = await open_(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n")
    await asyncio.wait_for(started.wait(), 2.0)
    w.close()
    await asyncio.wait_for(cancelled.wait(), 2.0)


async def test_header_values_keep_their_bytes_as_aiohttp_decoded_them(server: tuple[Server, Open]) -> None:
    """Conversation keys are hashed from header text: the same bytes give the same text as
    under the server before (UTF-8, other bytes as lone surrogates), so entries survive."""
    srv, open_ = server
    seen: list[str] = []

    async def grab(req: Request) -> Answer:
        seen.append(req.headers["X-Session-ID"])
        return json_answer({})

    srv.routes.add("GET", "/grab", grab)
    raw = "会话".encode() + b"\xe9\tz"
    r, _ = await open_(b"GET /grab HTTP/1.1\r\nHost: t\r\nX-Session-ID:  " + raw + b"  \r\n\r\n")
    assert (await _answer(r))[0] == 200
    assert seen == [raw.decode("utf-8", "surrogateescape")]


async def test_an_idle_kept_alive_connection_is_not_cut_by_the_header_timeout(server: tuple[Server, Open]) -> None:
    _, open_ = server
    r, w = await open_(_post(b"1"))
    assert (await _answer(r))[0] == 200
    await asyncio.sleep(0.8)  # past the header timeout, idle between requests
    w.write(_post(b"2"))
    assert (await _answer(r))[0] == 200
    with contextlib.suppress(Exception):
        w.close()
