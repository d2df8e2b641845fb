"""A lean HTTP/1.1 keep-alive client for the engine hops (tokenize, prefill, decode).

aiohttp's ClientSession spent ~190 us of CPU per request on this machine (URL objects,
cookie jar, tracing hooks, timer contexts); a POST on a pooled raw connection needs ~25 us.
The router makes up to three engine requests per turn, all on the TTFT path, and one event
loop serves every conversation, so that difference is most of the router's added latency
under load. The scope is deliberately narrow: POST a byte body to an engine we were
configured with; answers with Content-Length, chunked, or read-to-close bodies. Health checks
and everything else keep using aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

_HEAD_LIMIT = 64 * 1024
_HIGH_WATER = 1 << 20  # pause reading past this much unread body (a slow client)


class LinkError(Exception):
    """The engine could not be reached, or the connection broke before the answer ended."""


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    tls: bool
    host_header: bytes


def _target(base_url: str) -> _Target:
    parts = urlsplit(base_url)
    tls = parts.scheme == "https"
    host = parts.hostname or ""
    port = parts.port or (443 if tls else 80)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return _Target(host, port, tls, netloc.encode("ascii") if netloc.isascii() else netloc.encode("idna"))


class _Conn(asyncio.Protocol):
    """One engine connection: bytes land in `buf`; the reader waits on a future for more."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.closed = False
        self.timed_out = False
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self.idle_in: dict[_Conn, None] | None = None  # the pool holding it while idle

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._lost()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost()

    def _lost(self) -> None:
        """The engine closed (e.g. its keep-alive timeout): never hand this out again."""
        self.closed = True
        if self.idle_in is not None:
            self.idle_in.pop(self, None)
            self.idle_in = None
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    def expire(self) -> None:
        """The request's deadline passed: abort, so the engine stops working on it."""
        self.timed_out = True
        self.abort()

    def abort(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()
        self._lost()

    async def more(self) -> None:
        """Wait until more bytes arrive; LinkError/TimeoutError when none ever will."""
        if self.timed_out:
            raise TimeoutError("engine request timed out")
        if self.closed:
            raise LinkError("engine closed the connection before the answer ended")
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        self._waiter = self._loop.create_future()
        await self._waiter
        if self.timed_out:
            raise TimeoutError("engine request timed out")


class Response:
    """An engine's answer; the body is read once, either whole or as it arrives."""

    def __init__(self, conn: _Conn, url: str, status: int, headers: dict[str, str], keep_alive: bool) -> None:
        self._conn = conn
        self.url = url
        self.status = status
        self.headers = headers
        self.keep_alive = keep_alive
        self.done = False
        te = headers.get("transfer-encoding", "").lower()
        self._chunked = "chunked" in te
        length = headers.get("content-length")
        self._left = -1  # -1: until the connection closes
        if status in (204, 304) or (100 <= status < 200):
            self._left = 0
        elif not self._chunked and length is not None:
            try:
                self._left = int(length)
            except ValueError as exc:
                raise LinkError(f"bad Content-Length {length!r}") from exc
        if self._left < 0 and not self._chunked:
            self.keep_alive = False
        if self._left == 0:
            self.done = True

    @property
    def content_type(self) -> str:
        raw = self.headers.get("content-type", "application/octet-stream")
        return raw.split(";", 1)[0].strip().lower() or "application/octet-stream"

    async def read(self) -> bytes:
        return b"".join([block async for block in self.iter_blocks()])

    async def iter_blocks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive: everything buffered at each wake-up, de-chunked."""
        conn = self._conn
        while not self.done:
            block = self._take()
            if block:
                yield block
            elif not self.done:
                if self._left < 0 and not self._chunked and conn.closed:
                    self.done = True  # read-to-close body: EOF is its end
                    break
                await conn.more()

    def _take(self) -> bytes:
        buf = self._conn.buf
        if not buf:
            return b""
        if not self._chunked:
            if self._left < 0:
                out = bytes(buf)
                del buf[:]
                return out
            n = min(self._left, len(buf))
            out = bytes(buf[:n])
            del buf[:n]
            self._left -= n
            if self._left == 0:
                self.done = True
            return out
        parts: list[bytes] = []
        pos = 0
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if len(buf) - pos > _HEAD_LIMIT:
                    raise LinkError("chunk size line too long")
                break
            try:
                size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
            except ValueError as exc:
                raise LinkError("bad chunk size") from exc
            if size == 0:
                end = buf.find(b"\r\n\r\n", eol)  # the empty line after optional trailers
                if end < 0:
                    break
                pos = end + 4
                self.done = True
                break
            start = eol + 2
            if len(buf) < start + size + 2:
                break  # wait for the whole chunk
            parts.append(bytes(buf[start : start + size]))
            pos = start + size + 2
        del buf[:pos]
        return b"".join(parts)


class Link:
    """Pooled keep-alive connections per engine base URL."""

    def __init__(self, timeout_seconds: float, connect_timeout: float = 5.0) -> None:
        self._timeout = timeout_seconds
        self._connect_timeout = connect_timeout
        self._idle: dict[str, dict[_Conn, None]] = {}  # insertion-ordered: reuse the warmest
        self._targets: dict[str, _Target] = {}
        self._ssl: ssl.SSLContext | None = None

    def _target(self, base_url: str) -> _Target:
        t = self._targets.get(base_url)
        if t is None:
            t = self._targets[base_url] = _target(base_url)
        return t

    async def _connect(self, t: _Target) -> _Conn:
        loop = asyncio.get_running_loop()
        if t.tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(loop), t.host, t.port, ssl=self._ssl if t.tls else None),
                self._connect_timeout,
            )
        except (OSError, ssl.SSLError) as exc:
            raise LinkError(f"cannot connect to {t.host}:{t.port}: {exc!r}") from exc
        return conn

    def _pooled(self, base_url: str) -> _Conn | None:
        idle = self._idle.get(base_url)
        while idle:
            conn, _ = idle.popitem()
            conn.idle_in = None
            if not conn.closed and not conn.buf and conn.transport is not None and not conn.transport.is_closing():
                return conn
            conn.abort()
        return None

    @contextlib.asynccontextmanager
    async def post(self, base_url: str, path: str, body: bytes, headers: dict[str, str]) -> AsyncIterator[Response]:
        """POST and yield the answer once its head is in; the connection goes back to the pool
        only if the body was read to its end (otherwise it is closed: the engine sees the
        client leave and stops generating)."""
        t = self._target(base_url)
        loop = asyncio.get_running_loop()
        conn = self._pooled(base_url) or await self._connect(t)
        timer = loop.call_at(loop.time() + self._timeout, conn.expire)
        resp: Response | None = None
        try:  # any way out but a fully read answer closes the connection (finally)
            head = [b"POST ", path.encode(), b" HTTP/1.1\r\nHost: ", t.host_header]
            for name, value in headers.items():
                if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                    raise ValueError(f"header {name!r} contains a line break")
                head += [b"\r\n", name.encode("latin-1"), b": ", value.encode("latin-1")]
            head += [b"\r\nContent-Type: application/json\r\nContent-Length: ", str(len(body)).encode()]
            head += [b"\r\n\r\n", body]
            assert conn.transport is not None
            if conn.closed:
                raise LinkError("engine closed the connection")
            conn.transport.write(b"".join(head))
            resp = await self._head(conn, base_url + path)
            yield resp
        finally:
            timer.cancel()
            if resp is not None and resp.done and resp.keep_alive and not conn.closed and not conn.buf:
                conn.idle_in = self._idle.setdefault(base_url, {})
                conn.idle_in[conn] = None
            else:
                conn.abort()

    async def _head(self, conn: _Conn, url: str) -> Response:
        while True:
            i = conn.buf.find(b"\r\n\r\n")
            if i < 0:
                if len(conn.buf) > _HEAD_LIMIT:
                    raise LinkError("response head too large")
                await conn.more()
                continue
            head = bytes(conn.buf[:i])
            del conn.buf[: i + 4]
            lines = head.split(b"\r\n")
            parts = lines[0].split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
                raise LinkError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
            try:
                status = int(parts[1])
            except ValueError as exc:
                raise LinkError(f"bad status line {lines[0][:80]!r}") from exc
            if 100 <= status < 200:
                continue  # interim answer (100 Continue): the real one follows
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
            keep = parts[0] == b"HTTP/1.1" and headers.get("connection", "").lower() != "close"
            return Response(conn, url, status, headers, keep)

    async def close(self) -> None:
        for idle in list(self._idle.values()):
            for conn in list(idle):
                conn.abort()
        self._idle.clear()
