"""What a codec made of a byte stream, in one shape for the router's codecs and the reference
parsers, so that their framing decisions compare field by field."""

from __future__ import annotations

from dataclasses import dataclass

# How a server's reading of a connection ended.
WAITING = "waiting"  # at a message boundary or inside a message: more bytes are needed
REFUSED = "refused"  # an error answer; nothing after it is read
CLOSED = "closed"  # a message said the connection ends after it (Connection: close, HTTP/1.0)
UPGRADE = "upgrade"  # the parser handed the connection to another protocol (llhttp's Upgrade)
# How a client's reading of answers ended.
DONE = "done"  # every answer asked for was read whole
FAILED = "failed"  # an answer could not be read (malformed, cut short, too big)
PENDING = "pending"  # llhttp only: the last answer's head came, and then the connection's end


@dataclass(frozen=True)
class Message:
    """A request as a server took it."""

    method: bytes
    target: bytes
    version: bytes  # b"1.1" or b"1.0" (others are refused by all)
    body: bytes


@dataclass(frozen=True)
class Served:
    """A server's reading of one connection's bytes: the requests, then how it ended."""

    messages: tuple[Message, ...]
    end: str
    detail: str = ""  # the parser's own words for a refusal
    rest: bytes = b""  # h11's only: where it refused, the bytes from the request line it could not read


@dataclass(frozen=True)
class Reply:
    """An answer as a client read it; `keep`: the connection may carry the next request."""

    status: int
    body: bytes
    keep: bool


@dataclass(frozen=True)
class Read:
    """A client's reading of answers: those read whole, how it ended, and whether bytes were
    left after the last one read (the start of a next message, or junk)."""

    replies: tuple[Reply, ...]
    end: str
    detail: str = ""
    rest: bool = False


def norm_target(target: bytes) -> bytes:
    """A target as front.py hands it on (path, then `?query` when the query is not empty)."""
    return target[:-1] if target.find(b"?") == len(target) - 1 else target
