"""Decode's event stream to the client, block by block, from the engine socket's callback.

The router's cost per relayed chunk is what this module is for: in the common case a block
from decode is filtered and written to the client's socket within the callback that read it,
with no task switch, no stream reader and no writer coroutine. Everything else (the first
block, which carries the status line; storing the entry before the client can see the end
of the turn; waiting for a slow client; a malformed or broken stream; the end) makes the
relay hold what it has, pause reading from decode, and wake the handler's coroutine
(`Router._relay_stream`), which does it through the server's `front.Stream` and then hands
the relay back the client's socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .answer import Pieced
from .filters import StreamFilter
from .front import Stream
from .policy.first_token import Cut
from .wire import Call, Head, Sink


class StreamRelay(Sink):
    """A `wire.Sink` for decode's streamed answer."""

    def __init__(self, filt: StreamFilter, limit: int, on_first: Callable[[], None]) -> None:
        super().__init__()
        self.filt = filt
        self.limit = limit  # an error answer is kept whole up to this
        self.on_first = on_first  # the first data line reaches the client (TTFT)
        self.first = True
        self.call: Call | None = None
        self.head_: Head | None = None
        self.error_body: list[bytes] | None = None  # an answer of status >= 400, kept whole
        self.error_size = 0
        self.pending: list[bytes] = []  # filtered, for the coroutine to write
        self.last = b""  # decode's last block, or its last 16 bytes: a whole stream ends with [DONE]
        self.ended = False
        self.failed: Exception | None = None
        self.client_gone = False
        self.stored = False  # the entry is stored (or nothing to store): the end may pass
        self.said: Pieced | None = None  # pieces the answer together (a turn kept by its history)
        self.cut: Cut | None = None  # what the client already has of decode's stream (policy.first_token)
        self._out: Stream | None = None  # the client's answer, while the relay writes to it itself
        self.held = False  # the callbacks write nothing and decode is paused until release()
        self._wake: asyncio.Future[None] | None = None

    # ------------------------------------------------------------ the engine's side (callbacks)

    def head(self, head: Head) -> None:
        self.head_ = head
        if head.status >= 400:
            self.error_body = []
        self._hold()

    def body(self, data: bytes, framed: bytes | None) -> None:
        if self.error_body is not None:
            self.error_body.append(data)
            self.error_size += len(data)
            if self.error_size > self.limit:
                self.fail(ConnectionError(f"error answer above {self.limit} bytes"))
            return
        self.last = data if len(data) >= 16 else (self.last + data)[-16:]  # (no copy per block)
        filt = self.filt
        block = filt.feed(data)
        if self.said is not None and block:
            self.said.feed(block)  # decode's whole answer: the turn kept names it, cut or not
        if self.cut is not None and block:
            block = self.cut.feed(block)
            if self.cut.done:
                self.cut = None
        out = self._out
        if out is None or filt.dropped or (not self.stored and filt.captured.kv is not None):
            self.pending.append(block)
            self._hold()
            return
        if not block:
            return
        # A block the filter passed untouched goes on with decode's own chunk framing.
        if not out.put(block, framed if block is data else None):
            self.client_gone = True
            self.pending.append(block)
            self._hold()
            return
        if self.first and block.find(b"data:") >= 0:  # the space after data: is optional
            self.first = False
            self.on_first()
        if out.backed_up():
            self._hold()  # the coroutine waits for the client to drain

    def end(self) -> None:
        self.ended = True
        self._hold()

    def fail(self, exc: Exception) -> None:
        self.failed = exc
        if self.call is not None:
            self.call.abort()
        self._hold()

    # ------------------------------------------------------------ the coroutine's side

    def _hold(self) -> None:
        """Write nothing more from the callback; pause decode; wake the coroutine."""
        self._out = None
        if self.held:
            return
        self.held = True
        if self.call is not None and not self.ended and self.failed is None:
            self.call.pause()
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def wait(self) -> None:
        """Until the callbacks hold (at once if they already do)."""
        if not self.held:
            self._wake = asyncio.get_running_loop().create_future()
            try:
                await self._wake
            finally:
                self._wake = None

    def answer(self) -> dict[str, Any] | None:
        """The assistant message so far, if it is pieced together."""
        return self.said.message() if self.said is not None else None

    def take(self) -> list[bytes]:
        out, self.pending = self.pending, []
        return out

    def release(self, out: Stream | None) -> None:
        """Let decode's bytes come again; with the client's answer, the relay writes them to
        it itself (once its first write, which carries the status line and headers, has left).
        While something is still for the coroutine (blocks held, the end, a failure), it stays
        held: no callback would come to wake it (one read may bring the head, the body and
        the end at once)."""
        self._out = out if out is not None and out.transport is not None else None
        if self.pending or self.ended or self.failed is not None or self.client_gone:
            self._out = None
            return
        self.held = False
        if self.call is not None:
            self.call.resume()
