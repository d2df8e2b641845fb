"""The router's exceptions, in a module of their own: the modules on the request's path are
compiled with mypyc, whose native classes cannot subclass built-in exceptions such as
`ConnectionError` and, raised inside compiled coroutines, were matched wrongly by `except`.
Here they stay ordinary Python classes."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .endpoints import Endpoint


class WireError(ConnectionError):
    """The engine could not be reached, closed the connection early, or its HTTP was not
    readable: to the router the same thing as an engine that is not there."""


class ConnectTimeout(WireError):
    """No connection within the connect timeout: unreachable, not slow."""


class TooBig(Exception):
    """An answer longer than the router holds in memory (see upstream.MAX_ANSWER_BYTES)."""


class Refused(Exception):
    """A request the server answers itself, and then closes the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class NotCompact(Exception):
    """A line is not in the compact form the stream filter's byte surgery knows: parse it
    instead."""


class UpstreamError(Exception):
    """An engine could not be reached or answered 5xx: the turn may be retried."""

    def __init__(self, endpoint: Endpoint, status: int | None, detail: str, cause: BaseException | None = None) -> None:
        super().__init__(f"{endpoint.role} {endpoint.url}: {status or 'connection'}: {detail}")
        self.endpoint = endpoint
        self.status = status  # None: the engine could not be reached (or its answer was cut)
        # Kept here, not only as __cause__: a compiled coroutine's `raise ... from` left that unset.
        self.cause = cause

    @property
    def timed_out(self) -> bool:
        """The total timeout ran out (a connect timeout is an engine that cannot be reached)."""
        return isinstance(self.cause, TimeoutError) and not isinstance(self.cause, ConnectTimeout)


class MalformedAnswer(UpstreamError):
    """The engine answered, but not what the protocol says (not JSON, not an object, the
    wrong content type, cut short, too big, kv_transfer_params of the wrong shape). Never
    retried as unreachable: the engine is up, its answer is wrong."""

    def __init__(self, endpoint: Endpoint, status: int, detail: str) -> None:
        super().__init__(endpoint, status, detail)
        self.detail = detail  # what was wrong, without the engine's URL: the client sees it


class ClientFacingError(Exception):
    """An engine rejected the request itself (4xx): pass its answer to the client."""

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        super().__init__(f"engine answered {status}")
        self.status = status
        self.body = body
        self.content_type = content_type


class NoEngines(Exception):
    """No healthy prefill/decode pair of one generation (503, after one fresh look)."""


class EngineTimeout(UpstreamError):
    """No answer within upstreamTimeoutSeconds. The turn's time is spent, so it is not retried:
    the client gets 504 naming the role (its URL goes to the log only). The engine is not taken
    out: slow is not gone."""

    def __init__(self, ep: Endpoint, seconds: float) -> None:
        self.message = f"the {ep.role} engine timed out: no answer within upstreamTimeoutSeconds ({seconds:g} s)"
        super().__init__(ep, None, self.message)
