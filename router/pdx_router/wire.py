"""HTTP/1.1 to the engines on asyncio protocols, with no task switch per chunk.

Why not aiohttp's client on this path: relaying decode's stream cost pdx about twice the CPU
of the Rust routers, two thirds of it in aiohttp's per-chunk machinery (every read of its
stream reader is a future and a task switch; then the server's chunked writer and its drain
check). Here the socket's callback takes the framing off and hands each block straight to a
`Sink`, which for decode's stream filters it and writes it to the client in the same call.

Only what an engine sends is read: a status line, headers, and a body framed by
Content-Length, chunked encoding, or the end of the connection. Connections are kept alive
per engine. One kept idle for longer than `idle_seconds` is closed rather than reused
(uvicorn, vLLM's server, closes idle connections after 5 s: a request sent as it does so
would fail); and a request whose reused connection closes before any byte of the answer is
sent once more on a new one, which is what an engine closing an idle connection looks like.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, cast
from urllib.parse import urlsplit

from .errors import ConnectTimeout, TooBig, WireError

MAX_HEAD_BYTES: Final = 64 << 10  # status line and headers: vLLM's are a few hundred bytes
_HEX: Final = b"0123456789abcdefABCDEF"
_MAX_CHUNK_LINE: Final = 4096  # a chunk-size line with its extensions
_MAX_TRAILERS: Final = 64 << 10  # a chunked body's trailer lines, all of them (as a head's bound)
_CTL: Final = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # controls other than HTAB
_FIELD: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\x00-\x08\x0a-\x1f\x7f]*")  # name: value
_STATUS: Final = re.compile(rb"HTTP/1\.[01] [1-9][0-9][0-9](?: [^\x00-\x08\x0a-\x1f\x7f]*)?")  # reason optional


@dataclass(frozen=True, slots=True)
class Head:
    """The status line and headers of an answer."""

    status: int
    headers: dict[str, str]  # names in lower case; a repeated header's values joined by ", "

    @property
    def content_type(self) -> str:
        """The media type alone, in lower case (as aiohttp's `content_type` gives it)."""
        return self.headers.get("content-type", "application/octet-stream").split(";", 1)[0].strip().lower()


class Sink:
    """Where an answer goes, called from the socket's callback in this order: head once,
    body for every block of the body (framing taken off), then end or fail once. A base
    class, not a Protocol, so compiled callers dispatch through its table, not by name."""

    def head(self, head: Head) -> None:
        raise NotImplementedError

    def body(self, data: bytes, framed: bytes | None) -> None:
        """`framed`: the same block with its chunked framing, when one read was exactly one
        chunk (a relay to a chunked client may send it on as it came)."""
        raise NotImplementedError

    def end(self) -> None:
        raise NotImplementedError

    def fail(self, exc: Exception) -> None:
        raise NotImplementedError


class Framing:
    """How a body is delimited, taken off as it comes: `feed` returns the body's bytes of
    one read; `whole` says the body has ended, `extra` that bytes came after it."""

    def __init__(self) -> None:
        self.whole = False
        self.extra = False  # bytes after the body: the connection is not reused
        self.one_chunk = False  # the last read was exactly one whole chunk (Chunked)

    def feed(self, data: bytes) -> bytes:
        raise NotImplementedError


class _Length(Framing):
    """A body of Content-Length bytes."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.left = n

    def feed(self, data: bytes) -> bytes:
        if len(data) >= self.left:
            self.extra = len(data) > self.left
            data, self.left = data[: self.left], 0
            self.whole = True
            return data
        self.left -= len(data)
        return data


class _UntilClose(Framing):
    """A body that ends with the connection (neither length nor chunked)."""

    def feed(self, data: bytes) -> bytes:
        return data


class Chunked(Framing):
    """Chunked transfer coding, taken off incrementally: sizes in strict hex (extensions
    ignored, but no control bytes in them), each chunk's CRLF checked, trailers checked as
    field lines and dropped. `tail`: the bytes of the last read after the body's end (a
    pipelined request's, on the client's side)."""

    def __init__(self) -> None:
        super().__init__()
        self._need = 0  # bytes of the current chunk still to come
        self._crlf = False  # the CRLF after a chunk's data is next
        self._trailer = False  # the last chunk has come: trailer lines until an empty one
        self._trailers = 0  # bytes of trailer lines so far
        self._buf = b""
        self.tail = b""

    def feed(self, data: bytes) -> bytes:
        self.one_chunk = False
        if self._buf:
            data, self._buf = self._buf + data, b""
        elif not (self._need or self._crlf or self._trailer):
            # The common read: exactly one whole chunk (a streamed event), sized in plain hex.
            # Read byte by byte: compiled, that is a few instructions where find, strip and
            # int() were three method calls and two copies.
            n, length, i = len(data), 0, 0
            while i < n and i < 15:
                c = data[i]
                if 48 <= c <= 57:
                    length = length * 16 + c - 48
                elif 97 <= c <= 102:
                    length = length * 16 + c - 87
                elif 65 <= c <= 70:
                    length = length * 16 + c - 55
                else:
                    break
                i += 1
            end = i + 2 + length
            if i and length and end + 2 == n and data[i] == 13 and data[i + 1] == 10 and data.endswith(b"\r\n"):
                self.one_chunk = True
                return data[i + 2 : end]
        out: list[bytes] = []
        pos, n = 0, len(data)
        while pos < n:
            if self._need:
                take = min(self._need, n - pos)
                out.append(data[pos : pos + take] if take < n or pos else data)
                pos += take
                self._need -= take
                self._crlf = not self._need
            elif self._crlf:
                if n - pos < 2:
                    self._buf = data[pos:]
                    break
                if data[pos : pos + 2] != b"\r\n":
                    raise WireError("chunked body: no CRLF after a chunk")
                pos += 2
                self._crlf = False
            else:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    if n - pos > _MAX_CHUNK_LINE:
                        raise WireError("chunked body: a size line without its end")
                    self._buf = data[pos:]
                    break
                line = data[pos:eol]
                pos = eol + 2
                if self._trailer:
                    if not line:  # the empty line after the trailers: the body is whole
                        self.extra, self.whole = pos < n, True
                        self.tail = data[pos:]
                        return _joined(out)
                    self._trailers += len(line) + 2
                    if self._trailers > _MAX_TRAILERS or not _FIELD.fullmatch(line):
                        raise WireError(f"chunked body: a trailer that is not a field line {line[:40]!r}")
                    continue
                self._need = _chunk_size(line)
                self._trailer = not self._need
        return _joined(out)


def _chunk_size(line: bytes) -> int:
    """A chunk-size line's size: hex digits (no sign, prefix or blank; leading zeros are
    not digits that count), then extensions without control bytes."""
    size, semi, ext = line.partition(b";")
    if not size or size.strip(_HEX) or len(size.lstrip(b"0")) > 15 or (semi and _CTL.search(ext)):
        raise WireError(f"chunked body: bad chunk size {line[:40]!r}")
    return int(size, 16)


def _joined(pieces: list[bytes]) -> bytes:
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def parse_head(raw: bytes) -> tuple[Head, bool]:
    """A status line and headers (without the blank line) -> (head, keep-alive). Read as
    strictly as front.py reads a request's: field lines of a token, a colon and a value
    without controls (no bare CR or LF, no obs-fold), and framing headers checked whatever
    the status: one Transfer-Encoding, chunked, or one decimal Content-Length."""
    lines = raw.split(b"\r\n")
    if not _STATUS.fullmatch(lines[0]):
        raise WireError(f"not an HTTP/1.x status line: {lines[0][:60]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not _FIELD.fullmatch(line):
            raise WireError(f"unreadable header line {line[:60]!r}")
        name, _, value = line.partition(b":")
        key, text = name.decode("latin-1").lower(), value.strip(b" \t").decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    te, length = headers.get("transfer-encoding"), headers.get("content-length")
    if te is not None and (length is not None or te.lower() != "chunked"):
        also = " with Content-Length" if length is not None else ""
        raise WireError(f"Transfer-Encoding {te[:40]!r}{also}: only chunked, alone, is read")
    if length is not None and not (length.isdigit() and length.isascii()):  # ("²".isdigit() is true)
        raise WireError(f"bad Content-Length {length[:40]!r}")
    if length is not None:
        # Leading zeros off: int() raises past 4,300 digits, zeros included.
        length = headers["content-length"] = length.lstrip("0") or "0"
        if len(length) > 18:
            raise WireError(f"Content-Length of {len(length)} digits: above any answer")
    options = {o.strip() for o in headers.get("connection", "").lower().split(",")}
    keep = "close" not in options and (lines[0][5:8] == b"1.1" or "keep-alive" in options)
    return Head(int(lines[0][9:12]), headers), keep


def bare_eol(buf: bytes | bytearray, start: int) -> bool:
    """Does buf, from start, hold an LF without its CR, or a CR without its LF (a CR that
    ends buf may yet get its LF)? A head holding one is refused whole (RFC 9112 §2.2 lets a
    recipient refuse it), so both sides refuse it when seen rather than wait for its end."""
    i = buf.find(b"\n", start)
    while i >= 0:
        if i == 0 or buf[i - 1] != 0x0D:
            return True
        i = buf.find(b"\n", i + 1)
    i = buf.find(b"\r", start)
    while 0 <= i < len(buf) - 1:
        if buf[i + 1] != 0x0A:
            return True
        i = buf.find(b"\r", i + 1)
    return False


def _sink_of(call: Call) -> Sink | None:
    """A call's sink, read as it is now (see _Conn.data_received)."""
    return call.sink


def _body_of(head: Head) -> Framing | None:
    """How the body is framed (parse_head checked the headers); None: there is none."""
    if head.status in (204, 304) or 100 <= head.status < 200:
        return None
    if "transfer-encoding" in head.headers:
        return Chunked()
    length = head.headers.get("content-length")
    if length is not None:
        return _Length(int(length)) if int(length) else None
    return _UntilClose()


class Call:
    """One request in flight. The sink's owner may pause and resume reading (backpressure)
    and abort (the client left: closing the connection makes the engine abort the request)."""

    def __init__(
        self, wire: Wire, key: tuple[str, int], request: list[bytes], sink: Sink, silence: float | None
    ) -> None:
        self._wire = wire
        self._key = key
        self._request = request
        self.sink: Sink | None = sink
        self.conn: _Conn | None = None
        self.silence = silence  # seconds without a byte from the engine that end the call
        # Reads are counted, not timed: a clock read per chunk cost more than the rest of the
        # chunk's bookkeeping. The timer looks every quarter of `silence` whether the count
        # moved, so the call ends between 1 and 1.25 times `silence` after its last byte.
        self.reads = 0
        self._seen = -1  # the count at the last look
        self._quiet_since = 0.0  # monotonic time of the last look that saw the count move
        self.paused = False
        self._timer: asyncio.TimerHandle | None = None

    def pause(self) -> None:
        self.paused = True
        if self.conn is not None and self.conn.transport is not None:
            self.conn.transport.pause_reading()

    def resume(self) -> None:
        self.paused = False
        self.reads += 1  # a pause is the client's time, not the engine's silence
        if self.conn is not None and self.conn.transport is not None:
            self.conn.transport.resume_reading()

    def abort(self) -> None:
        """Stop: the sink hears nothing more, and the connection is closed, not reused."""
        self.sink = None
        self._stop_timer()
        if self.conn is not None:
            self.conn.drop()

    # --------------------------------------------------------------- the wire's side

    def _send(self, conn: _Conn) -> None:
        self.conn = conn
        conn.call = self
        if self.silence is not None and self._timer is None:
            self._check_silence()
        assert conn.transport is not None
        conn.transport.writelines(self._request)

    def _check_silence(self) -> None:
        self._timer = None
        if self.sink is None or self.silence is None:
            return
        now = time.monotonic()
        if self.paused or self.reads != self._seen:
            self._seen, self._quiet_since = self.reads, now
        elif now - self._quiet_since >= self.silence:
            self._fail(TimeoutError(f"no byte from the engine within {self.silence:g} s"))
            return
        wait = min(self.silence / 4, self._quiet_since + self.silence - now)
        self._timer = asyncio.get_running_loop().call_later(wait, self._check_silence)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fail(self, exc: Exception) -> None:
        sink = self.sink
        self.abort()
        if sink is not None:
            sink.fail(exc)

    def _done(self) -> None:
        sink, self.sink = self.sink, None
        self._stop_timer()
        if sink is not None:
            sink.end()

    def _resend(self) -> None:
        """The reused connection closed before answering: once more on a new one."""
        self.conn = None
        task = asyncio.get_running_loop().create_task(self._reconnect())
        self._wire.tasks.add(task)
        task.add_done_callback(self._wire.tasks.discard)

    async def _reconnect(self) -> None:
        try:
            conn = await self._wire.connect(self._key)
        except WireError as exc:
            self._fail(exc)
            return
        if self.sink is None:  # aborted meanwhile
            conn.drop()
            return
        self._send(conn)
        if self.paused and conn.transport is not None:
            conn.transport.pause_reading()


class _Conn(asyncio.Protocol):
    """One keep-alive connection to an engine: reads one answer at a time into its call."""

    def __init__(self, wire: Wire, key: tuple[str, int]) -> None:
        self._wire = wire
        self._key = key
        self.transport: asyncio.Transport | None = None
        self.call: Call | None = None
        self.answers = 0  # answered requests: a reused connection may have gone stale
        self.idle_since = 0.0
        self._buf = b""
        self._body: Framing | None = None
        self._keep = False
        self._got = False  # a byte of the current answer has come

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is not a subclass)

    def data_received(self, data: bytes) -> None:
        call = self.call
        # Not `call.sink is None`: that narrows the attribute for the rest of this method, and
        # compiled, the later reads then fail with a TypeError once the sink has let go (an
        # answer too long by its Content-Length aborts the call inside sink.head()).
        if call is None or _sink_of(call) is None:
            self.drop()  # bytes nobody asked for: the connection cannot be trusted with another request
            return
        self._got = True
        call.reads += 1
        body = self._body
        if body is None:
            try:
                data = self._read_head(data, call)
            except WireError as exc:
                call._fail(exc)
                return
            body = self._body
            if body is None or call.sink is None or not data:
                return
        try:
            block = body.feed(data)
        except WireError as exc:
            call._fail(exc)
            return
        if block and call.sink is not None:
            call.sink.body(block, data if body.one_chunk else None)
        if body.whole and self.call is call:
            self._finish(call, reuse=self._keep and not body.extra)

    def _read_head(self, data: bytes, call: Call) -> bytes:
        """Take the head off `data` and tell the sink; what follows it is body."""
        checked = max(len(self._buf) - 1, 0)  # (what came before was looked at for bare CR and LF)
        buf = self._buf + data if self._buf else data
        while True:  # (a loop, not a call per interim answer: a read may hold thousands)
            end = buf.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4)
            if end < 0:
                if bare_eol(buf, checked):
                    raise WireError("a bare CR or LF in the answer's head")
                if len(buf) > MAX_HEAD_BYTES:
                    raise WireError(f"answer headers above {MAX_HEAD_BYTES} bytes")
                self._buf = buf
                return b""
            head, self._keep = parse_head(buf[:end])
            buf, checked = buf[end + 4 :], 0
            if head.status == 101:  # (RFC 9110 §15.2.2: no switch was asked for)
                raise WireError("101 Switching Protocols to a request that asked for no upgrade")
            if not 100 <= head.status < 200:  # else an interim answer (100 Continue): the real one follows
                break
        self._buf = b""
        rest = buf
        body = _body_of(head)
        assert call.sink is not None
        call.sink.head(head)
        if body is None:
            if self.call is call:
                self._finish(call, reuse=self._keep and not rest)
            return b""
        self._body = body
        return rest

    def _finish(self, call: Call, reuse: bool) -> None:
        self.call, self._body, self._got = None, None, False
        self.answers += 1
        mine, call.conn = call.conn is self, None  # the call's pause/resume/abort no longer reach it
        call._done()
        if reuse and mine and self.transport is not None:
            self.transport.resume_reading()  # the call may have paused it
            self._wire.release(self._key, self)
        else:
            self.drop()

    def eof_received(self) -> bool | None:
        return False  # close: connection_lost ends an answer that runs until the close

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._wire.forget(self._key, self)
        call, self.call = self.call, None
        if call is None or call.sink is None:
            return
        if isinstance(self._body, _UntilClose):
            call._done()
        elif not self._got and self.answers:  # a kept-alive connection the engine had closed
            call._resend()
        else:
            call._fail(WireError(f"the engine closed the connection{f': {exc!r}' if exc else ''}"))

    def drop(self) -> None:
        self.call = None
        if self.transport is not None:
            self.transport.abort()


class Wire:
    """Connections to the engines, kept alive per (host, port)."""

    def __init__(self, connect_timeout: float = 5.0, idle_seconds: float = 4.0) -> None:
        self.connect_timeout = connect_timeout
        self.idle_seconds = idle_seconds
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._bases: dict[str, tuple[tuple[str, int], bytes, bytes]] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    def _base(self, url: str) -> tuple[tuple[str, int], bytes, bytes]:
        """(host, port), Host header value and path prefix of an engine's base URL."""
        got = self._bases.get(url)
        if got is None:
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname:
                raise WireError(f"engine URL {url!r}: only http://host:port URLs are spoken to")
            port = parts.port or 80
            got = self._bases[url] = ((parts.hostname, port), parts.netloc.encode(), parts.path.rstrip("/").encode())
        return got

    async def send(
        self, url: str, path: str, body: bytes, headers: Mapping[str, str], sink: Sink, silence: float | None = None
    ) -> Call:
        """POST `body` (JSON) to `url + path`; the answer goes to `sink`. `silence`: seconds
        without a byte from the engine after which the sink fails with TimeoutError."""
        key, host, prefix = self._base(url)
        lines = [
            b"POST %s%s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            % (prefix, path.encode(), host, len(body))
        ]
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
                raise ValueError(f"header {name!r}: no line breaks or colons in a header sent to an engine")
            lines.append(f"{name}: {value}\r\n".encode("latin-1"))
        lines.append(b"\r\n")
        call = Call(self, key, [b"".join(lines), body], sink, silence)
        conn = self._take(key)
        call._send(conn if conn is not None else await self.connect(key))
        return call

    async def connect(self, key: tuple[str, int]) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(lambda: _Conn(self, key), key[0], key[1])
        except TimeoutError:
            raise ConnectTimeout(f"no connection to {key[0]}:{key[1]} within {self.connect_timeout:g} s") from None
        except OSError as exc:
            raise WireError(f"cannot connect to {key[0]}:{key[1]}: {exc.strerror or exc!r}") from None
        return conn

    def _take(self, key: tuple[str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to have gone stale
            fresh = now - conn.idle_since < self.idle_seconds
            if fresh and conn.transport is not None and not conn.transport.is_closing():
                return conn
            conn.drop()
        return None

    def release(self, key: tuple[str, int], conn: _Conn) -> None:
        conn.idle_since = time.monotonic()
        self._idle.setdefault(key, []).append(conn)

    def forget(self, key: tuple[str, int], conn: _Conn) -> None:
        idle = self._idle.get(key)
        if idle and conn in idle:
            idle.remove(conn)

    async def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.drop()
        self._idle.clear()
        for task in list(self.tasks):
            task.cancel()


class Collect(Sink):
    """A sink that keeps a whole (small) answer: prefill's, /tokenize's, a JSON decode's."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.head_: Head | None = None
        self.parts: list[bytes] = []
        self.size = 0
        self.done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.call: Call | None = None

    def head(self, head: Head) -> None:
        self.head_ = head
        length = head.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            self._over(f"answer of {length} bytes, above {self.limit}")

    def body(self, data: bytes, framed: bytes | None) -> None:
        self.size += len(data)
        if self.size > self.limit:
            self._over(f"answer above {self.limit} bytes")
            return
        self.parts.append(data)

    def end(self) -> None:
        if not self.done.done():
            self.done.set_result(b"".join(self.parts))

    def fail(self, exc: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(exc)

    def abort(self) -> None:
        """Stop the call, if it was sent. A method, not an `if` in the caller's `finally`:
        compiled, that `if` saw the type the try block's assignment narrowed the attribute
        to, and failed on the None an exception before the assignment left (mypyc 2.4)."""
        if self.call is not None:
            self.call.abort()

    def _over(self, why: str) -> None:
        self.abort()
        if not self.done.done():
            self.done.set_exception(TooBig(why))
