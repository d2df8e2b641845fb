"""The router's own HTTP/1.1 client to the engines (pdx_router.wire), against raw servers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from pdx_router.errors import TooBig, WireError
from pdx_router.wire import Chunked, Collect, Head, Wire, parse_head

Reply = Callable[[int, bytes], bytes | None]  # (request number on this connection, request) -> answer
Start = Callable[[Reply], Awaitable["RawServer"]]


@dataclass
class RawServer:
    """A loopback server answering each request with the bytes `reply` gives (None: close)."""

    reply: Reply
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    url: str = ""
    server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.split(b"Content-Length: ", 1)[1].split(b"\r\n", 1)[0])
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                answer = self.reply(n, request)
                n += 1
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


@pytest.fixture
async def raw() -> AsyncIterator[Start]:
    servers: list[RawServer] = []

    async def start(reply: Reply) -> RawServer:
        s = RawServer(reply)
        s.server = await asyncio.start_server(s.handle, "127.0.0.1", 0)
        s.url = f"http://127.0.0.1:{s.server.sockets[0].getsockname()[1]}"
        servers.append(s)
        return s

    yield start
    for s in servers:
        assert s.server is not None
        s.server.close()


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(body),
        extra,
        body,
    )


async def fetch(wire: Wire, url: str, silence: float | None = None) -> tuple[Head, bytes]:
    sink = Collect(1 << 20)
    sink.call = await wire.send(url, "/v1/x", b"{}", {"Authorization": "Bearer k"}, sink, silence=silence)
    raw = await asyncio.wait_for(sink.done, 5)
    assert sink.head_ is not None
    return sink.head_, raw


def chunks(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def decode_all(data: bytes, step: int) -> tuple[bytes, bool]:
    c, out, whole = Chunked(), [], False
    for i in range(0, len(data), step):
        out.append(c.feed(data[i : i + step]))
        whole = c.whole
    return b"".join(out), whole


def test_a_chunked_body_reads_the_same_however_the_socket_splits_it() -> None:
    data = chunks(b"data: {}\n\n", b"x" * 300, b"data: [DONE]\n\n")
    for step in (1, 2, 3, 7, 64, len(data)):
        assert decode_all(data, step) == (b"data: {}\n\n" + b"x" * 300 + b"data: [DONE]\n\n", True)


def test_a_chunked_body_read_one_whole_chunk_at_a_time_reads_the_same() -> None:
    c, parts = Chunked(), [b"data: {}\n\n", b"y" * 4000, b"data: [DONE]\n\n"]
    reads = [b"%x\r\n%s\r\n" % (len(p), p) for p in parts] + [b"0\r\n\r\n"]
    assert [(c.feed(r), c.whole) for r in reads] == [(p, False) for p in parts] + [(b"", True)]


def test_a_read_of_exactly_one_chunk_is_marked_so_it_can_be_sent_on_framed_as_it_came() -> None:
    c = Chunked()
    for read, block in [(b"00A\r\n0123456789\r\n", b"0123456789"), (b"b\r\nhello world\r\n", b"hello world")]:
        assert (c.feed(read), c.one_chunk) == (block, True)
    # Two chunks in one read, a chunk cut short, a size with an extension: not one chunk.
    for read in (b"1\r\na\r\n1\r\nb\r\n", b"5\r\nhel", b"lo\r\n", b"2;x=1\r\nhi\r\n"):
        c.feed(read)
        assert not c.one_chunk, read
    assert not c.whole


def test_chunk_extensions_and_trailers_are_read_and_dropped() -> None:
    data = b"5;name=value\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n"
    assert decode_all(data, 1) == (b"hello", True)


@pytest.mark.parametrize("size", [b"1_0", b"+5", b"0x5", b"-1", b"", b"zz", b"1" * 16])
def test_a_chunk_size_that_is_not_plain_hex_is_refused(size: bytes) -> None:
    with pytest.raises(WireError, match="chunk size"):
        Chunked().feed(size + b"\r\nhello\r\n")


def test_a_chunk_without_its_crlf_is_refused() -> None:
    with pytest.raises(WireError, match="CRLF"):
        Chunked().feed(b"5\r\nhelloXX0\r\n\r\n")


def test_an_unreadable_status_line_or_header_is_refused() -> None:
    with pytest.raises(WireError, match="status line"):
        parse_head(b"HTTP/2 200 OK")
    with pytest.raises(WireError, match="header line"):
        parse_head(b"HTTP/1.1 200 OK\r\nno colon here")
    head, keep = parse_head(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nX-A: 1\r\nx-a: 2")
    assert (head.status, head.content_type, head.headers["x-a"], keep) == (200, "text/event-stream", "1, 2", True)
    assert parse_head(b"HTTP/1.1 200 OK\r\nConnection: close")[1] is False
    assert parse_head(b"HTTP/1.0 200 OK")[1] is False


@pytest.mark.parametrize(
    ("head", "why"),
    [
        (b"HTTP/1.2 200 OK", "status line"),
        (b"HTTP/1.1 099 x", "status line"),
        (b"HTTP/1.1 200 a\x01b", "status line"),
        (b"HTTP/1.1 200 OK\r\n folded: 1", "header line"),
        (b"HTTP/1.1 200 OK\r\nX-A: a\x00b", "header line"),
        (b"HTTP/1.1 200 OK\r\nX-A: a\nb", "header line"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked", "only chunked"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5", "only chunked"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: \xb2", "bad Content-Length"),  # "²".isdigit() is true
        (b"HTTP/1.1 204 No Content\r\nContent-Length: 5, 5", "bad Content-Length"),  # on any status
        (b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 4400, "digits: above any answer"),  # int() would raise
    ],
)
def test_a_head_read_more_loosely_by_others_is_refused_naming_what(head: bytes, why: str) -> None:
    with pytest.raises(WireError, match=why):
        parse_head(head)


def test_leading_zeros_of_a_content_length_are_no_digits_that_count() -> None:
    head, _ = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: " + b"0" * 4400 + b"7")
    assert head.headers["content-length"] == "7"


def test_a_trailer_that_is_not_a_field_line_or_a_chunk_extension_with_a_control_is_refused() -> None:
    with pytest.raises(WireError, match="trailer"):
        Chunked().feed(b"0\r\ngarbage\r\n\r\n")
    with pytest.raises(WireError, match="chunk size"):
        Chunked().feed(b"5;a\nb\r\nhello\r\n0\r\n\r\n")
    c = Chunked()  # leading zeros do not count towards the 15 digits; the bytes after the end are kept
    assert (c.feed(b"0000000000000000005\r\nhello\r\n0\r\nX: y\r\n\r\nNEXT"), c.whole, c.tail) == (
        b"hello", True, b"NEXT"
    )


async def test_thousands_of_interim_answers_in_one_read_then_the_answer_are_read(raw: Start) -> None:
    """1xx answers are skipped in a loop: one call each blew Python's recursion limit."""
    s = await raw(lambda _n, _req: b"HTTP/1.1 100 Continue\r\n\r\n" * 3000 + ok(b"{}"))
    wire = Wire()
    try:
        assert (await fetch(wire, s.url))[1] == b"{}"
    finally:
        await wire.close()


def _always(answer: bytes) -> Reply:
    return lambda _n, _req: answer


async def test_a_101_or_a_bare_lf_head_fails_the_call(raw: Start) -> None:
    for answer, why in [
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n", "asked for no upgrade"),
        (b"HTTP/1.1 200 OK\nContent-Length: 2\n\n{}", "bare CR or LF"),
    ]:
        s = await raw(_always(answer))
        wire = Wire()
        try:
            with pytest.raises(WireError, match=why):
                await fetch(wire, s.url)
        finally:
            await wire.close()


async def test_an_answer_longer_than_the_sink_holds_by_its_length_fails_cleanly(
    raw: Start, caplog: pytest.LogCaptureFixture
) -> None:
    """The sink lets go inside head(); compiled, a read of the narrowed `call.sink` after it
    raised TypeError in data_received (the loop logged a traceback)."""
    s = await raw(_always(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n{}"))
    wire = Wire()
    try:
        sink = Collect(1000)
        sink.call = await wire.send(s.url, "/v1/x", b"{}", {}, sink)
        with pytest.raises(TooBig):
            await asyncio.wait_for(sink.done, 5)
        await asyncio.sleep(0.05)
    finally:
        await wire.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


async def test_requests_one_after_another_share_one_kept_alive_connection(raw: Start) -> None:
    s = await raw(lambda n, _req: ok(b'{"n": %d}' % n))
    wire = Wire()
    try:
        answers = [await fetch(wire, s.url) for _ in range(3)]
    finally:
        await wire.close()
    assert [a[1] for a in answers] == [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}']
    assert s.connections == 1
    assert b"Authorization: Bearer k\r\n" in s.requests[0] and b"Host: 127.0.0.1:" in s.requests[0]


async def test_an_answer_saying_close_or_with_bytes_past_its_length_is_not_reused(
    raw: Start,
) -> None:
    s = await raw(lambda n, _req: ok(b"{}", b"Connection: close\r\n") if n == 0 else ok(b"{}") + b"junk")
    wire = Wire()
    try:
        for _ in range(3):
            assert (await fetch(wire, s.url))[1] == b"{}"
    finally:
        await wire.close()
    assert s.connections == 3


async def test_a_kept_alive_connection_the_engine_closed_unanswered_is_retried_on_a_new_one(
    raw: Start,
) -> None:
    # The second request on each connection finds it closed (as an engine closes an idle one).
    s = await raw(lambda n, _req: ok(b"{}") if n == 0 else None)
    wire = Wire()
    try:
        assert (await fetch(wire, s.url))[1] == b"{}"
        assert (await fetch(wire, s.url))[1] == b"{}"
    finally:
        await wire.close()
    assert s.connections == 2 and len(s.requests) == 3  # sent, sent again on a new connection


async def test_a_new_connection_closed_before_the_answer_is_an_error_not_a_retry(
    raw: Start,
) -> None:
    s = await raw(lambda _n, _req: None)
    wire = Wire()
    try:
        with pytest.raises(WireError, match="closed the connection"):
            await fetch(wire, s.url)
    finally:
        await wire.close()
    assert len(s.requests) == 1


async def test_an_idle_connection_older_than_idle_seconds_is_not_reused(
    raw: Start,
) -> None:
    s = await raw(lambda _n, _req: ok(b"{}"))
    wire = Wire(idle_seconds=0.05)
    try:
        await fetch(wire, s.url)
        await asyncio.sleep(0.1)
        await fetch(wire, s.url)
    finally:
        await wire.close()
    assert s.connections == 2


async def test_an_engine_silent_past_the_bound_fails_the_call_with_a_timeout(
    raw: Start,
) -> None:
    s = await raw(lambda _n, _req: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
    wire = Wire()
    t0 = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            await fetch(wire, s.url, silence=0.2)
    finally:
        await wire.close()
    assert 0.15 < time.monotonic() - t0 < 2


async def test_an_unreachable_engine_is_a_wire_error() -> None:
    wire = Wire()
    with pytest.raises(WireError, match="cannot connect"):
        await fetch(wire, "http://127.0.0.1:9")  # discard: nothing listens
    await wire.close()


async def test_a_header_value_with_a_line_break_is_never_sent() -> None:
    wire = Wire()
    with pytest.raises(ValueError, match="line breaks"):
        await wire.send("http://127.0.0.1:9", "/x", b"{}", {"X-A": "1\r\nX-Injected: 2"}, Collect(10))
    await wire.close()
