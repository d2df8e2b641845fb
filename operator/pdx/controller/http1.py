"""One HTTP/1.1 connection, request after request: just what the operator's API calls need.

Why not `http.client`: its response path parses headers through the `email` package and its
request path builds them one `putheader` call at a time, ~0.2 ms of CPU per request here
against ~0.07 ms for this (a pass sends 13 applies and a status patch). What the API server
answers is all this reads: a status line, headers, then a body delimited by Content-Length,
chunked transfer coding, or the end of the connection; 1xx interim answers are skipped.
"""

from __future__ import annotations

import io
import re
import socket
import ssl
from dataclasses import dataclass, field

MAX_LINE = 65536  # a status or header line longer than this is not an API server's
MAX_HEADERS = 200
# An answer's body, read in pieces up to this: a quarter of the operator's memory limit (512 MiB
# in the chart), far above any list it reads. A Content-Length is a claim, not an allocation.
MAX_BODY = 128 << 20
_PIECE = 1 << 20
_STATUS = re.compile(rb"HTTP/1\.([01]) ([1-9][0-9][0-9])(?: [^\x00-\x08\x0a-\x1f\x7f]*)?\r\n")
# name: value, the value without controls but HTAB (no bare CR or LF, no obs-fold)
_FIELD = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*\r\n")
_HEX = re.compile(rb"([0-9A-Fa-f]+)(?:;[^\x00-\x08\x0a-\x1f\x7f]*)?\r\n")  # a chunk size, extensions ignored


class ProtocolError(ConnectionError):
    """The peer's answer is not HTTP/1.x as this reads it; the connection is dropped."""


class Stale(ConnectionError):
    """A kept-alive connection the server had closed: nothing was answered, send again."""


@dataclass
class Connection:
    host: str
    port: int
    timeout: float
    context: ssl.SSLContext | None = None  # TLS when given
    _sock: socket.socket | None = field(default=None, init=False, repr=False)
    _file: io.BufferedReader | None = field(default=None, init=False, repr=False)
    used: bool = field(default=False, init=False)  # whether a request went out on this socket

    def _open(self) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.context is not None:
            sock = self.context.wrap_socket(sock, server_hostname=self.host)
        self._sock, self._file, self.used = sock, sock.makefile("rb"), False

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = self._file = None

    def request(self, method: str, target: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, bytes]:
        """(status, body); raises `Stale` when a reused connection was closed before answering,
        any other OSError on transport failures (the connection is closed then)."""
        if self._sock is None:
            self._open()
        assert self._sock is not None
        reused = self.used
        where = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal
        head = [f"{method} {target} HTTP/1.1\r\nHost: {where}:{self.port}\r\n"]
        head += [f"{k}: {v}\r\n" for k, v in headers.items()]
        if body is not None:
            head.append(f"Content-Length: {len(body)}\r\n")
        head.append("\r\n")
        data = "".join(head).encode("latin-1") + (body or b"")
        try:
            try:
                self._sock.sendall(data)
                self.used = True
                status, length, chunked, close = self._head(reused)
            except (BrokenPipeError, ConnectionResetError) as err:
                if reused:
                    raise Stale(str(err)) from err
                raise
            if status in (204, 304) or method == "HEAD":
                payload = b""
            elif chunked:
                payload = self._chunks()
            elif length is not None:
                payload = self._exactly(length)
            else:
                payload, close = self._read_all(), True
        except BaseException:
            self.close()
            raise
        if close:
            self.close()
        return status, payload

    def _line(self) -> bytes:
        assert self._file is not None
        line = self._file.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise ProtocolError("line too long")
        return line

    def _head(self, reused: bool) -> tuple[int, int | None, bool, bool]:
        """(status, Content-Length, chunked, close after) of the final answer: read as strictly
        as the router reads an engine's (lines end in CRLF; one framing, plainly written)."""
        while True:
            line = self._line()
            if not line:
                if reused:
                    raise Stale("closed before answering")
                raise ProtocolError("closed before answering")
            status_line = _STATUS.fullmatch(line)
            if status_line is None:
                raise ProtocolError(f"bad status line {line[:100]!r}")
            status = int(status_line.group(2))
            length: int | None = None
            chunked = False
            options: set[bytes] = set()
            for _ in range(MAX_HEADERS + 1):
                line = self._line()
                if line == b"\r\n":
                    break
                if not line:
                    raise ProtocolError("closed in the headers")
                field_line = _FIELD.fullmatch(line)
                if field_line is None:
                    raise ProtocolError(f"bad header line {line[:100]!r}")
                key, value = field_line.group(1).lower(), field_line.group(2)
                if key == b"content-length":
                    if length is not None or not value.isdigit():
                        raise ProtocolError(f"bad Content-Length {value[:40]!r} (one decimal number)")
                    digits = value.lstrip(b"0") or b"0"  # (int() raises past 4,300 digits, zeros included)
                    if len(digits) > 18:
                        raise ProtocolError(f"an answer above {MAX_BODY} bytes")
                    length = int(digits)
                elif key == b"transfer-encoding":
                    if chunked or value.lower() != b"chunked":
                        raise ProtocolError(f"Transfer-Encoding {value[:40]!r}: only chunked, once, is read")
                    chunked = True
                elif key == b"connection":
                    options |= {o.strip() for o in value.lower().split(b",")}
            else:
                raise ProtocolError("too many headers")
            if chunked and length is not None:
                raise ProtocolError("Content-Length and Transfer-Encoding together")
            if status == 101:  # (RFC 9110 §15.2.2: no switch was asked for)
                raise ProtocolError("101 Switching Protocols to a request that asked for no upgrade")
            if 100 <= status < 200:
                continue  # an interim answer (100 Continue): the real one follows
            close = b"close" in options or (status_line.group(1) == b"0" and b"keep-alive" not in options)
            return status, length, chunked, close

    def _exactly(self, n: int, out: list[bytes] | None = None) -> bytes:
        """n bytes, read a piece at a time (a lying Content-Length allocates nothing)."""
        assert self._file is not None
        got = 0 if out is None else sum(len(p) for p in out)
        if got + n > MAX_BODY:
            raise ProtocolError(f"an answer above {MAX_BODY} bytes")
        pieces: list[bytes] = []
        left = n
        while left:
            data = self._file.read(min(left, _PIECE))
            if not data:
                raise ProtocolError(f"body cut short at {n - left} of {n} bytes")
            pieces.append(data)
            left -= len(data)
        return b"".join(pieces)

    def _chunks(self) -> bytes:
        out: list[bytes] = []
        while True:
            line = self._line()
            size_line = _HEX.fullmatch(line)
            digits = size_line.group(1).lstrip(b"0") or b"0" if size_line is not None else b""
            if size_line is None or len(digits) > 15:
                raise ProtocolError(f"bad chunk size line {line[:40]!r}")
            size = int(digits, 16)
            if size == 0:
                while (line := self._line()) != b"\r\n":
                    if _FIELD.fullmatch(line) is None:  # (an empty read: cut short)
                        raise ProtocolError(f"bad trailer line {line[:40]!r}")
                return b"".join(out)
            out.append(self._exactly(size, out))
            if self._line() != b"\r\n":
                raise ProtocolError("no CRLF after a chunk's data")

    def _read_all(self) -> bytes:
        """Until the connection's end (an answer framed by nothing else), up to MAX_BODY."""
        assert self._file is not None
        out: list[bytes] = []
        size = 0
        while data := self._file.read(_PIECE):
            size += len(data)
            if size > MAX_BODY:
                raise ProtocolError(f"an answer above {MAX_BODY} bytes")
            out.append(data)
        return b"".join(out)


__all__ = ["Connection", "ProtocolError", "Stale"]
