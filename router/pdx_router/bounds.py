"""How much of the router one client can hold: connections, and the time to send a request.

aiohttp bounds neither the number of open connections nor the time a client may take to
send its request headers (its keep-alive timeout only closes a connection that is idle, and
it is an hour). So each connection is wrapped in a small protocol that (1) refuses it with
503 once `maxConnections` are open and (2) closes it with 408 if a request has not reached
the handler within `headerTimeoutSeconds` of its first byte (of the connection, for the first
request). While the handler runs nothing is timed here: an answer streams to a slow reader
for as long as it reads, and the body's own bound is the handler's (`bodyTimeoutSeconds`).
An idle keep-alive connection is not timed either (aiohttp's keep-alive timeout is).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web

from .metrics import Metrics

log = logging.getLogger("pdx_router")

_FULL = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
_SLOW = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Connections:
    """The open client connections of one server, and the middleware that tells each one
    when a request of it is being handled (so its header timer stays off meanwhile)."""

    def __init__(self, header_timeout_seconds: float, max_connections: int, metrics: Metrics) -> None:
        self.header_timeout = header_timeout_seconds
        self.max_connections = max_connections
        self.metrics = metrics
        self.open: dict[asyncio.BaseTransport, _Guarded] = {}

    def factory(self, server: web.Server) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for loop.create_server: aiohttp's handler, guarded."""
        return lambda: _Guarded(server(), self)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        guard = self.open.get(request.transport) if request.transport is not None else None
        if guard is None:  # served without the guard (a test's plain TCPSite)
            return await handler(request)
        guard.begin()
        try:
            return await handler(request)
        finally:
            guard.busy = False


class _Guarded(asyncio.Protocol):
    """aiohttp's RequestHandler behind a watch: every call is passed on unchanged."""

    def __init__(self, inner: asyncio.Protocol, conns: Connections) -> None:
        self._inner = inner
        self._conns = conns
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.busy = False  # a request of this connection is in the handler

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # (uvloop's is not a subclass)
        if len(self._conns.open) >= self._conns.max_connections:
            self._conns.metrics.connections_closed.labels("max_connections").inc()
            transport.write(_FULL)
            transport.close()  # the inner handler never saw it: nothing to tell it
            return
        self._transport = transport
        self._conns.open[transport] = self
        self._conns.metrics.open_connections.set(len(self._conns.open))
        self._inner.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._transport is None:
            return
        if not self.busy and self._timer is None:
            self._arm()  # the first byte of the next request on a kept-alive connection
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._transport is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is None:
            return
        self._disarm()
        self._conns.open.pop(self._transport, None)
        self._conns.metrics.open_connections.set(len(self._conns.open))
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def begin(self) -> None:
        """A request has arrived whole (its headers at least): its time is the handler's."""
        self.busy = True
        self._disarm()

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._conns.header_timeout, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self.busy or self._transport is None or self._transport.is_closing():
            return
        self._conns.metrics.connections_closed.labels("header_timeout").inc()
        log.info("closed a connection that sent no whole request within headerTimeoutSeconds")
        self._transport.write(_SLOW)
        self._transport.close()


CONNECTIONS = web.AppKey("connections", Connections)


class BoundedSite(web.BaseSite):
    """web.TCPSite, with each connection guarded by `conns`."""

    def __init__(self, runner: web.BaseRunner, conns: Connections, host: str, port: int, backlog: int = 1024) -> None:
        super().__init__(runner, backlog=backlog)
        self._conns = conns
        self._host = host
        self._port = port
        self.sockets: tuple[Any, ...] = ()

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._conns.factory(server), self._host, self._port, backlog=self._backlog
        )
        self.sockets = tuple(self._server.sockets)
