"""wire.py's engine connection driven by bytes: what a POST's caller got of the answer, and
whether the connection went back to the pool for the next request."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from pdx_router.errors import TooBig, WireError
from pdx_router.wire import Call, Collect, Wire, _Conn

from .outcome import DONE, FAILED, Read, Reply
from .transport import Transport

MAX_ANSWER = 1 << 20  # what the fuzzed Collect holds: a longer answer fails, by policy
_KEY = ("engine", 80)
_LOOP = asyncio.new_event_loop()


class WireCrash(AssertionError):
    """An answer's bytes raised something other than the router's own errors."""


async def _read(reads: Sequence[bytes]) -> Read:
    wire = Wire()
    conn, t = _Conn(wire, _KEY), Transport()
    conn.connection_made(t)
    sink = Collect(MAX_ANSWER)
    call = sink.call = Call(wire, _KEY, [b"POST /x HTTP/1.1\r\n\r\n"], sink, None)
    call._send(conn)
    for data in reads:
        try:
            conn.data_received(data)  # after the answer, a byte nobody asked for drops the connection
        except Exception as exc:
            raise WireCrash(f"wire.py raised {exc!r} reading an answer") from exc
        if t.closed:
            break
    if not sink.done.done() or t.closed:
        conn.connection_lost(None)  # the engine's end of the connection
    assert sink.done.done(), "the answer neither ended nor failed at the connection's end"
    failure = sink.done.exception()
    if failure is not None:
        if not isinstance(failure, (WireError, TooBig)):
            raise WireCrash(f"the sink failed with {failure!r}, not the router's own error")
        return Read((), FAILED, str(failure))
    head = sink.head_
    assert head is not None
    kept = conn in wire._idle.get(_KEY, [])
    return Read((Reply(head.status, sink.done.result(), kept),), DONE)


def read(reads: Sequence[bytes]) -> Read:
    """What wire.py read of one answer, delivered in these reads."""
    return _LOOP.run_until_complete(_read(reads))
