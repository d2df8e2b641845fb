"""The client-facing HTTP/1.1 server: requests in, whole answers or event streams out.

Why not aiohttp's server: serving only the client's half of a streamed turn (read a chat
body, send the events) cost it as much user CPU as a Rust router's whole turn
(`scripts/bench_client_side.py`). A router needs little of HTTP: a few routes, bodies of a
bounded size, answers that are whole or a stream of events. This is that, strict where a
proxy must be: one framing per request (Content-Length or chunked, never both), header
bytes as RFC 9110 allows them, bounded lines.

The bounds a client can hold the router by are kept here, per connection:
`maxConnections` (503 above it), `headerTimeoutSeconds` (408 if a request's head is not
whole within it of its first byte), `maxRequestBytes` (413). `bodyTimeoutSeconds` is the
handler's: it times its own `Request.read()`. An idle kept-alive connection is closed after
`KEEPALIVE_SECONDS`. A client that goes away cancels its handler (the relay then aborts
decode's request).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Final, cast
from urllib.parse import parse_qsl

import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from .errors import Refused, WireError
from .metrics import Metrics
from .wire import Chunked, bare_eol

log: Final = logging.getLogger("pdx_router")

MAX_LINE: Final = 8190  # a request line or one header line (aiohttp's limit before: clients see the same)
MAX_HEAD: Final = 64 << 10  # all of a request's head
# Header lines of one request (Apache's LimitRequestFields). The byte bounds alone let a head
# of 64 KiB hold some 16,000 short lines, each a multidict entry; long lines meet MAX_HEAD
# first (100 of MAX_LINE are 800 KiB), so this bounds the count, never the size.
MAX_HEADERS: Final = 100
# An idle kept-alive connection: above any load balancer's idle timeout (aiohttp's, before).
KEEPALIVE_SECONDS: Final = 3630.0
READ_AHEAD: Final = 1 << 16  # bytes buffered past the request being served before reading pauses

_TOKEN: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE: Final = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # controls other than HTAB (obs-text is allowed)
_TARGET: Final = re.compile(rb"/[\x21-\x7e]*")  # origin form: RFC 3986 has no other bytes (llhttp and h11 agree)
_FULL: Final = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
_SLOW: Final = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


class Request:
    """One client request: its head, parsed; its body, as it comes (`read`)."""

    def __init__(self, conn: _Conn, method: str, path: str, query: str, headers: CIMultiDictProxy[str]) -> None:
        self.method = method
        self.path = path
        self._query = query
        self.headers = headers
        self._conn = conn
        # One read's bytes as they came; from the second read on, one growing buffer (a body
        # sent in many small reads holds its bytes, not an object per read).
        self._body: bytes | bytearray = b""
        self._size = 0
        self.complete = False
        self._ready: asyncio.Future[None] | None = None
        self.failed: Refused | None = None

    @property
    def query(self) -> dict[str, str]:
        return dict(parse_qsl(self._query, keep_blank_values=True))

    async def read(self) -> bytes:
        """The whole body (raises `Refused` above maxRequestBytes or for a bad framing)."""
        if not self.complete and self.failed is None:
            self._ready = asyncio.get_running_loop().create_future()
            await self._ready
        if self.failed is not None:
            raise self.failed
        return bytes(self._body) if isinstance(self._body, bytearray) else self._body

    def _feed(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self._conn.server.max_body:
            self._fail(_too_big(self._conn.server.max_body))
            return
        if not data:
            return
        if not self._body:
            self._body = data
        elif isinstance(self._body, bytearray):
            self._body += data
        else:
            self._body = bytearray(self._body) + data

    def _done(self) -> None:
        self.complete = True
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(None)

    def _fail(self, exc: Refused) -> None:
        self.failed = exc
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(None)


class Answer:
    """A whole answer."""

    def __init__(
        self, status: int, body: bytes = b"", content_type: str = "application/json",
        headers: dict[str, str] | None = None, close: bool = False,
    ) -> None:  # fmt: skip
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers or {}
        self.close = close  # the connection carries no next request (the body was not read whole)


def json_answer(data: object, status: int = 200, headers: dict[str, str] | None = None) -> Answer:
    return Answer(status, orjson.dumps(data), headers=headers)


class Stream:
    """An answer sent as it comes (chunked on HTTP/1.1). Its head leaves with the first
    block: one send on the TTFT path. After that, `transport` is the client's socket, which
    the relay writes decode's blocks to itself (framed as `chunked` says)."""

    def __init__(self, status: int, headers: dict[str, str]) -> None:
        self.status = status
        self.headers = headers
        self.transport: asyncio.Transport | None = None  # set once the head has left
        self.chunked = True
        self._conn: _Conn | None = None
        self._ended = False
        self._head_only = False

    def start(self, req: Request) -> None:
        """Bind to the request's connection (no byte is sent yet)."""
        self._conn = req._conn
        self._conn.stream = self
        self.chunked = self._conn.version_11
        self._head_only = req.method == "HEAD"

    def write(self, block: bytes) -> None:
        conn = self._conn
        assert conn is not None, "Stream.start(request) first"
        if conn.transport is None or conn.transport.is_closing():
            raise ConnectionResetError("the client has gone")
        framed = _chunk(block) if self.chunked and block else block
        if self._head_only:
            framed = b""
        if self.transport is None:
            framing = "Transfer-Encoding: chunked" if self.chunked else "Connection: close"
            conn.transport.write(conn.head(self.status, self.headers, framing) + framed)
            self.transport = conn.transport
        elif framed:
            conn.transport.write(framed)

    def put(self, block: bytes, framed: bytes | None) -> bool:
        """The relay's write of one block, once the head has left; `framed`: the block with
        its chunked framing already (as decode sent it). False: the client has gone."""
        conn, transport = self._conn, self.transport
        if conn is None or transport is None or conn.transport is None or conn.eof:
            return False
        try:
            if not self.chunked:
                transport.write(block)
            elif framed is not None:
                transport.write(framed)
            else:
                transport.write(_chunk(block))
        except RuntimeError:  # uvloop: the socket closed on an error, connection_lost not yet run
            return False
        return True

    def backed_up(self) -> bool:
        """The client's socket holds more than the transport's high mark: wait for drain()."""
        return self._conn is not None and self._conn.write_paused

    async def drain(self) -> None:
        """Until the client has taken what is queued (down to the transport's low mark)."""
        assert self._conn is not None
        await self._conn.drained()

    def end(self) -> None:
        if self._ended:
            return
        self.write(b"")  # the head, if nothing was written
        self._ended = True
        assert self._conn is not None and self._conn.transport is not None
        if self.chunked and not self._head_only:
            self._conn.transport.write(b"0\r\n\r\n")


Handler = Callable[[Request], Awaitable[Answer | Stream]]


class Routes:
    """Exact paths -> {method: handler}. GET routes answer HEAD too."""

    def __init__(self) -> None:
        self.table: dict[str, dict[str, Handler]] = {}

    def add(self, method: str, path: str, handler: Handler) -> None:
        self.table.setdefault(path, {})[method] = handler


class Server:
    """The listening side: routes, bounds, open connections."""

    def __init__(
        self, routes: Routes, metrics: Metrics, max_connections: int, header_timeout: float, max_body: int
    ) -> None:
        self.routes = routes
        self.metrics = metrics
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.max_body = max_body
        self.open: set[_Conn] = set()
        self._server: asyncio.AbstractServer | None = None
        self._date = (0, "")

    async def start(self, host: str, port: int, backlog: int = 1024) -> int:
        """Listen; the port bound (port 0: one the OS picks)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Conn(self), host, port, backlog=backlog)
        # Any: uvloop's server gives a list where typeshed says tuple (compiled code checks).
        server: Any = self._server
        return cast(int, server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.open):
            conn.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    def date(self) -> str:
        now = int(time.time())
        if self._date[0] != now:
            self._date = (now, formatdate(now, usegmt=True))
        return self._date[1]


class _Conn(asyncio.Protocol):
    """One client connection: requests one at a time, in order."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        # What came of the next request's head: one read's bytes as they came, else one growing
        # buffer searched from where the last search stopped (a head sent a byte at a time costs
        # linear time, not quadratic).
        self._buf: bytes | bytearray = b""
        self._scanned = 0
        self._line_seen = False  # the request line has ended (its length is within MAX_LINE)
        self._request: Request | None = None  # the request being served
        self._body: Chunked | int | None = None  # what of its body is still to come
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_idle = False  # the running timer is the keep-alive's, not the header timeout
        self._paused_reading = False
        self._drain: asyncio.Future[None] | None = None
        self.write_paused = False
        self.eof = False  # the client half-closed: its transport is closing
        self.version_11 = True
        self.keep_alive = True
        self.stream: Stream | None = None  # the request's answer, once it is a stream

    # ------------------------------------------------------------ the transport's callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # (uvloop's is not a subclass)
        srv = self.server
        if len(srv.open) >= srv.max_connections:
            srv.metrics.connections_closed.labels("max_connections").inc()
            transport.write(_FULL)
            transport.close()
            return
        self.transport = transport
        srv.open.add(self)
        srv.metrics.open_connections.set(len(srv.open))
        self._arm(srv.header_timeout, self._head_too_slow)

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return
        if self._request is not None and self._body is not None:
            data = self._feed_body(data)
            if self._request is None or not data:
                return
        buf = self._buf
        if not buf:
            self._buf = data
        elif isinstance(buf, bytearray):
            buf += data
        else:
            self._buf = bytearray(buf) + data
        if self._task is not None:  # a request is being answered: the next one waits
            if len(self._buf) > READ_AHEAD and not self._paused_reading:
                self._paused_reading = True
                self.transport.pause_reading()
            return
        self._next()

    def eof_received(self) -> bool | None:
        """The client's end: the connection closes, and a request being served is cancelled
        (a client that half-closes is taken as gone, as aiohttp's server did)."""
        self.eof = True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:
            return
        self._disarm()
        self.server.open.discard(self)
        self.server.metrics.open_connections.set(len(self.server.open))
        self.transport = None
        if self._request is not None and not self._request.complete:
            self._request._fail(Refused(400, "the client closed the connection mid-body"))
        if self._task is not None:
            self._task.cancel()  # the client left: the handler (and decode's request) ends
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(ConnectionResetError("the client has gone"))

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    async def drained(self) -> None:
        if self.transport is None:
            raise ConnectionResetError("the client has gone")
        if self.write_paused:
            self._drain = asyncio.get_running_loop().create_future()
            try:
                await self._drain
            finally:
                self._drain = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # ------------------------------------------------------------ requests

    def _next(self) -> None:
        """Start the next request whose head has come whole (if any)."""
        assert self.transport is not None
        buf = self._buf
        if not self._scanned and buf[:1] in (b"\r", b"\n"):
            buf = self._buf = buf.lstrip(b"\r\n")  # empty lines before a request line are ignored (RFC 9112)
        if not buf:
            return
        if self._timer is None or self._timer_idle:
            self._arm(self.server.header_timeout, self._head_too_slow)  # its first byte
        end = buf.find(b"\r\n\r\n", max(self._scanned - 3, 0), MAX_HEAD + 4)
        if end < 0:
            if bare_eol(buf, max(self._scanned - 1, 0)):  # (a head that can never be whole)
                self._refuse(Refused(400, _BARE))
                return
            self._scanned = len(buf)
            if len(buf) > MAX_HEAD:
                self._refuse(Refused(431, f"the request's head is above {MAX_HEAD} bytes"))
            elif not self._line_seen and len(buf) > MAX_LINE:
                if buf.find(b"\r\n", 0, MAX_LINE + 2) < 0:
                    self._refuse(Refused(431, f"a request or header line is above {MAX_LINE} bytes"))
                self._line_seen = True
            return
        with memoryview(buf) as view:  # one copy of each part, whichever type buf is
            head, rest = bytes(view[:end]), bytes(view[end + 4 :])
        self._buf, self._scanned, self._line_seen = b"", 0, False
        try:
            req, body = self._parse(head)
        except Refused as exc:
            self._refuse(exc)
            return
        self._disarm()
        self._request, self._body = req, body
        if body is None:
            if req.failed is None:
                req._done()
        elif req.headers.get("Expect", "").lower() == "100-continue":
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._task = asyncio.get_running_loop().create_task(self._serve(req))
        if rest:
            self.data_received(rest)

    def _parse(self, head: bytes) -> tuple[Request, Chunked | int | None]:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
            raise _refused(lines[0], "not an HTTP/1.x request line")
        if len(lines[0]) > MAX_LINE:
            raise Refused(431, f"the request line is above {MAX_LINE} bytes")
        target = parts[1]
        if not _TARGET.fullmatch(target):
            raise _refused(target, _NOT_ORIGIN)
        self.version_11 = parts[2] == b"HTTP/1.1"
        if len(lines) - 1 > MAX_HEADERS:
            raise Refused(431, f"the request has {len(lines) - 1} header lines, above {MAX_HEADERS}; send fewer")
        headers: CIMultiDict[str] = CIMultiDict()
        for line in lines[1:]:
            if len(line) > MAX_LINE:
                raise Refused(431, f"a header line is above {MAX_LINE} bytes; send it shorter")
            name, colon, value = line.partition(b":")
            if not colon or not _TOKEN.fullmatch(name):
                raise _refused(line, "a header line that is not name: value (folded lines are refused)")
            value = value.strip(b" \t")
            if _BAD_VALUE.search(value):
                raise _refused(value, f"the {name.decode()} header holds a control character")
            # As aiohttp decoded them: a header's non-UTF-8 bytes become lone surrogates (the
            # conversation keys made from them stay the same across the change of server).
            headers.add(name.decode("ascii"), value.decode("utf-8", "surrogateescape"))
        _check_host(headers, self.version_11)
        # Connection's options are tokens: "closed" is not "close".
        options = {o.strip() for o in ",".join(headers.getall("Connection", [])).lower().split(",")}
        self.keep_alive = "close" not in options and (self.version_11 or "keep-alive" in options)
        path, _, query = target.decode("utf-8", "surrogateescape").partition("?")
        req = Request(self, parts[0].decode("ascii"), path, query, CIMultiDictProxy(headers))
        body = _framing(headers, self.version_11)
        if isinstance(body, int) and body > self.server.max_body:
            # The handler's read() says so (its route is counted); the body is never read.
            req._fail(_too_big(self.server.max_body))
            self.keep_alive = False
            return req, None
        return req, body

    def _feed_body(self, data: bytes) -> bytes:
        """Body bytes to the request; what comes after its end."""
        req, body = self._request, self._body
        assert req is not None and body is not None
        if isinstance(body, int):
            take = data[:body] if len(data) > body else data
            req._feed(take)
            left = body - len(take)
            rest = data[len(take) :]
        else:
            try:
                piece = body.feed(data)
                whole = body.whole
            except WireError as exc:
                req._fail(Refused(400, f"the request body's chunked framing is broken: {exc}"))
                self.keep_alive = False
                self._body = None
                return b""
            req._feed(piece)
            left = 0 if whole else 1
            rest = body.tail if whole else b""  # a pipelined request's first bytes
        if req.failed is not None:
            self._body = None
            self.keep_alive = False
            return b""
        if left:
            self._body = left if isinstance(body, int) else body
            return b""
        self._body = None
        req._done()
        return rest

    async def _serve(self, req: Request) -> None:
        srv = self.server
        methods = srv.routes.table.get(req.path)
        handler = None if methods is None else methods.get("GET" if req.method == "HEAD" else req.method)
        route = req.path if handler is not None else None  # counted as unmatched: a bounded label set
        try:
            if methods is None:
                answer: Answer | Stream = _error_answer(404, f"no route {req.path[:100]}")
            elif handler is None:
                allow = ", ".join(sorted(methods))
                answer = _error_answer(405, f"{req.method} is not allowed here; use {allow}")
                answer.headers["Allow"] = allow
            else:
                try:
                    answer = await handler(req)
                except Refused as exc:
                    answer = _error_answer(exc.status, exc.message, close=True)
        except asyncio.CancelledError:
            self._task = None
            raise
        except Exception as exc:
            if not isinstance(exc, ConnectionResetError):
                log.exception("unhandled error serving %s %s", req.method, req.path[:100])
            if self.stream is not None and self.stream.transport is not None:
                # Part of a stream has left: no whole answer can follow it, only the cut.
                srv.metrics.request(route, self.stream.status)
                self._task = None
                self.close()
                return
            answer = _error_answer(500, "internal error; see the router's log", close=True)
        srv.metrics.request(route, answer.status)
        if isinstance(answer, Answer):
            self._send(req, answer)
        self._task = None
        self._request = None
        self.stream = None
        if self.transport is None:
            return
        if not self.keep_alive or (isinstance(answer, Answer) and answer.close) or not req.complete:
            self.transport.close()  # (a body left unread: its bytes are not the next request)
            return
        if isinstance(answer, Stream) and not answer.chunked:
            self.transport.close()
            return
        if self._paused_reading:
            self._paused_reading = False
            self.transport.resume_reading()
        if self._buf:
            self._next()
        else:
            self._arm(KEEPALIVE_SECONDS, self.close, idle=True)

    def _send(self, req: Request, answer: Answer) -> None:
        if self.transport is None:
            return
        close = answer.close or not self.keep_alive or not req.complete
        extra = {**answer.headers, "Content-Type": answer.content_type}
        framing = f"Content-Length: {len(answer.body)}"
        if close:
            framing += "\r\nConnection: close"
        elif not self.version_11:
            framing += "\r\nConnection: keep-alive"
        head = self.head(answer.status, extra, framing)
        self.transport.write(head if req.method == "HEAD" else head + answer.body)

    def head(self, status: int, headers: dict[str, str], framing: str) -> bytes:
        lines = [f"HTTP/1.1 {status} {_reason(status)}", f"Date: {self.server.date()}", framing]
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"header {name!r}: CR or LF in an answer's header")
            lines.append(f"{name}: {value}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")

    def _refuse(self, exc: Refused) -> None:
        """A request the server cannot take: its answer, then the connection closes."""
        assert self.transport is not None
        self._disarm()
        self.server.metrics.request(None, exc.status)
        self.keep_alive = False
        body = orjson.dumps(error_body(exc.status, exc.message))
        framing = f"Content-Length: {len(body)}\r\nConnection: close"
        head = self.head(exc.status, {"Content-Type": "application/json"}, framing)
        self.transport.write(head + body)
        self.transport.close()

    # ------------------------------------------------------------ timers

    def _arm(self, seconds: float, then: Callable[[], None], idle: bool = False) -> None:
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(seconds, then)
        self._timer_idle = idle

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_too_slow(self) -> None:
        self._timer = None
        if self.transport is None or self._task is not None or self.transport.is_closing():
            return
        self.server.metrics.connections_closed.labels("header_timeout").inc()
        log.info("closed a connection that sent no whole request within headerTimeoutSeconds")
        self.transport.write(_SLOW)
        self.transport.close()


_BARE: Final = "a bare CR or LF in the request's head; end each line with CRLF"
_NOT_ORIGIN: Final = "the request target must be a path (origin form) in visible ASCII; percent-encode the rest"


def _refused(part: bytes, why: str) -> Refused:
    """A 400 for a part of the head: a bare CR or LF said as such, else `why`."""
    return Refused(400, _BARE if part.find(b"\r") >= 0 or part.find(b"\n") >= 0 else why)


def _check_host(headers: CIMultiDict[str], version_11: bool) -> None:
    """RFC 9112 §3.2: an HTTP/1.1 request carries exactly one Host; two are ambiguous on any
    version (a proxy may route by one and the next hop by the other). HTTP/1.0 may omit it."""
    hosts = headers.getall("Host", [])
    if len(hosts) > 1:
        raise Refused(400, f"the Host header is sent {len(hosts)} times; send it once")
    if not hosts and version_11:
        raise Refused(400, "an HTTP/1.1 request needs a Host header (RFC 9112 §3.2); send Host: <the router's host>")


def _framing(headers: CIMultiDict[str], version_11: bool) -> Chunked | int | None:
    """How the body is delimited: bytes to come, chunked, or none."""
    te = headers.getall("Transfer-Encoding", [])
    cl = headers.getall("Content-Length", [])
    if te and cl:
        raise Refused(400, "Content-Length and Transfer-Encoding together; send one")
    if te:
        if not version_11:  # RFC 9112 §6.1: faulty framing, whatever the coding
            raise Refused(400, "Transfer-Encoding in an HTTP/1.0 request; send Content-Length")
        # Exactly chunked: not even an empty list element (", chunked"), which llhttp and h11
        # refuse too; a proxy before the router reads the framing as they do.
        codings = [c.strip().lower() for c in ",".join(te).split(",")]
        if codings != ["chunked"]:
            raise Refused(501, "only Transfer-Encoding: chunked is understood")
        return Chunked()
    if not cl:
        return None
    if len(set(cl)) != 1 or not cl[0].isdigit() or not cl[0].isascii():
        raise Refused(400, "Content-Length must be one decimal number")
    digits = cl[0].lstrip("0")
    # Above 18 digits: above any maxRequestBytes (and past 4,300 int() would raise).
    return (int(digits) if len(digits) <= 18 else 1 << 62) if digits else None


def _chunk(block: bytes) -> bytes:
    """One block in chunked transfer coding."""
    return b"".join((b"%x\r\n" % len(block), block, b"\r\n"))


def _too_big(limit: int) -> Refused:
    return Refused(413, f"the request body is above maxRequestBytes ({limit} bytes); send less")


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def error_body(status: int, message: str, request_id: str | None = None) -> dict[str, object]:
    """The one shape of every error the router answers with, the server's own and the handlers'."""
    err: dict[str, object] = {"message": message, "type": "pdx_router_error", "code": status}
    if request_id is not None:
        err["request_id"] = request_id
    return {"error": err}


def _error_answer(status: int, message: str, close: bool = False) -> Answer:
    return Answer(status, orjson.dumps(error_body(status, message)), close=close)
