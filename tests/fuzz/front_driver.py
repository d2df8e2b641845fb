"""front.py's connection protocol driven by bytes: what it served of them, and how it ended.

Every request is routed to one handler that reads its body whole and answers 200, so that
each message's framing shows whatever its method and path. The handler's table is filled
from the request lines found in the bytes (front answers an unknown route without reading
its body, which would hide the body's framing)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

from pdx_router.errors import Refused
from pdx_router.front import Answer, Request, Routes, Server, _Conn
from pdx_router.metrics import Metrics

from .outcome import CLOSED, REFUSED, WAITING, Message, Served
from .transport import Transport

MAX_BODY = 1 << 20  # maxRequestBytes in the fuzz server: a body above it is a 413, by policy
_SETTLE_STEPS = 10_000  # loop turns a served connection may take to go quiet: past it, a hang
_PATH = re.compile(rb" (/[^ ?\r\n]*)")  # a request line's target, after its method
_TOKEN_BYTES = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class FrontHang(AssertionError):
    """The server kept running with nothing left to read."""


class FrontCrash(AssertionError):
    """A request's bytes raised something other than a refusal."""


class _Harness:
    """One server and event loop for the process; each run is one connection."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.routes = Routes()
        self.server = Server(self.routes, Metrics(), max_connections=1 << 20, header_timeout=60.0, max_body=MAX_BODY)
        self.messages: list[Message] = []
        self.refusal: Refused | None = None

    async def handle(self, req: Request) -> Answer:
        try:
            body = await req.read()
        except Refused as exc:
            self.refusal = exc
            raise
        target = req.path + ("?" + req._query if req._query else "")
        version = b"1.1" if req._conn.version_11 else b"1.0"
        self.messages.append(Message(req.method.encode(), target.encode("utf-8", "surrogateescape"), version, body))
        return Answer(200, b"")

    def route(self, data: bytes) -> None:
        self.routes.table.clear()
        for found in _PATH.finditer(data):
            name = found.group(1).decode("utf-8", "surrogateescape")
            self.routes.add("GET", name, self.handle)  # (what HEAD is routed to)
            start = found.start()
            while start > 0 and data[start - 1] in _TOKEN_BYTES and found.start() - start < 8192:
                start -= 1  # (back over the method, however long: a request line is at most 8190)
            method = data[start : found.start()]
            for i in range(len(method)):  # a body's last bytes may run into the method
                self.routes.add(method[i:].decode(), name, self.handle)

    async def settle(self, conn: _Conn) -> None:
        """Let the loop run until the connection waits for bytes (or is closed)."""
        for _ in range(_SETTLE_STEPS):
            task, req = conn._task, conn._request
            if task is None or task.done() or (req is not None and not req.complete and req.failed is None):
                return
            await asyncio.sleep(0)
        raise FrontHang("front.py kept serving with nothing left to read")

    async def run(self, reads: Sequence[bytes]) -> Served:
        self.messages, self.refusal = [], None
        conn, t = _Conn(self.server), Transport()
        conn.connection_made(t)
        try:
            for data in reads:
                await self.settle(conn)
                if t.closed:
                    break
                try:
                    conn.data_received(data)
                except Exception as exc:  # (asyncio would log it and drop the connection unanswered)
                    raise FrontCrash(f"front.py raised {exc!r} reading a request") from exc
            await self.settle(conn)
            return self._ending(t)
        finally:
            conn.connection_lost(None)
            for _ in range(3):
                await asyncio.sleep(0)  # the cancelled handler ends

    def _ending(self, t: Transport) -> Served:
        got = tuple(self.messages)
        if self.refusal is not None:
            return Served(got, REFUSED, f"{self.refusal.status} {self.refusal.message}")
        if not t.closed:
            return Served(got, WAITING)
        status, message = last_answer(bytes(t.out))
        if status >= 400:
            return Served(got, REFUSED, f"{status} {message}")
        return Served(got, CLOSED)


def last_answer(out: bytes) -> tuple[int, str]:
    """The status and error message of the last answer front.py wrote (its answers carry a
    Content-Length; a HEAD's is 0, the handler's, or the head-level refusal's with its body)."""
    status, body, pos = 0, b"", 0
    while pos < len(out):
        end = out.index(b"\r\n\r\n", pos)
        head = out[pos:end]
        status = int(head[9:12])
        length = re.search(rb"\r\nContent-Length: (\d+)", head)
        size = int(length.group(1)) if length and status >= 200 else 0
        body, pos = out[end + 4 : end + 4 + size], end + 4 + size
        if status in (404, 405):
            raise AssertionError(f"harness: a request was not routed ({head[:80]!r})")
    message = body.split(b'"message":"', 1)[1].split(b'","type"', 1)[0] if b'"message":"' in body else b""
    return status, message.decode("utf-8", "replace")


_HARNESS: _Harness | None = None


def serve(reads: Sequence[bytes]) -> Served:
    """What front.py served of one connection's reads."""
    global _HARNESS
    if _HARNESS is None:
        _HARNESS = _Harness()
    _HARNESS.route(b"".join(reads))
    return _HARNESS.loop.run_until_complete(_HARNESS.run(reads))
