"""The operator's http1.Connection driven by bytes: the answers its requests got, one after
another on one connection, until it closed it or an answer could not be read."""

from __future__ import annotations

import io
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from pdx.controller.http1 import Connection

from .outcome import DONE, FAILED, Read, Reply

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer


class _Socket:
    """What Connection.request writes to: nothing is read back from it."""

    def sendall(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass


class _Reads(io.RawIOBase):
    """The server's bytes, at most one read's worth per call (as a socket gives them)."""

    def __init__(self, reads: Sequence[bytes]) -> None:
        self.reads = [r for r in reads if r]

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        if not self.reads:
            return 0
        data, view = self.reads[0], memoryview(buffer).cast("B")
        n = min(len(view), len(data))
        view[:n] = data[:n]
        self.reads[0] = data[n:]
        if not self.reads[0]:
            self.reads.pop(0)
        return n


class Http1Crash(AssertionError):
    """An answer's bytes raised something other than a ConnectionError."""


def read(reads: Sequence[bytes], methods: Sequence[str]) -> Read:
    """One request per method on one connection; the answers as Connection read them."""
    conn = Connection("engine", 80, 1.0)
    conn._sock = cast(socket.socket, _Socket())
    conn._file = io.BufferedReader(_Reads(reads))
    out: list[Reply] = []
    for method in methods:
        try:
            status, body = conn.request(method, "/x", b"{}" if method != "GET" else None, {})
        except ConnectionError as exc:  # ProtocolError and Stale among them
            return Read(tuple(out), FAILED, str(exc))
        except Exception as exc:
            raise Http1Crash(f"http1.Connection raised {exc!r}") from exc
        out.append(Reply(status, body, conn._sock is not None))
        if conn._sock is None:
            break
    return Read(tuple(out), DONE)
