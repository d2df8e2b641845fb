"""The router's exceptions, in a module of their own: the data path (`wire`, `relay`,
`filters`, `front`) is compiled with mypyc, whose native classes cannot subclass built-in
exceptions such as `ConnectionError` and, raised inside compiled coroutines, were matched
wrongly by `except`. Here they stay ordinary Python classes."""

from __future__ import annotations


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
