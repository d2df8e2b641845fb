"""Issue 35's framing checks, as a client would try them: raw bytes on a socket to pdx-router
between fake engines. Each is refused with its status, the connection closes, and nothing
after the refused head (a smuggled request among it) reaches an engine or is answered."""

from __future__ import annotations

import asyncio
import re

import pytest

from tests.router.conftest import StackFactory

P = b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\n"
SMUGGLED = b"GET /v1/models HTTP/1.1\r\nHost: router\r\n\r\n"
CHUNKED = P + b"Transfer-Encoding: chunked\r\n\r\n"
CHECKS: dict[str, tuple[bytes, int]] = {
    "Content-Length and Transfer-Encoding": (
        P + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        400,
    ),
    "Transfer-Encoding and Content-Length": (
        P + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        400,
    ),
    "two Content-Lengths": (P + b"Content-Length: 2\r\nContent-Length: 7\r\n\r\n{}", 400),
    "a signed Content-Length": (P + b"Content-Length: +2\r\n\r\n{}", 400),
    "a negative Content-Length": (P + b"Content-Length: -1\r\n\r\n", 400),
    "a hex Content-Length": (P + b"Content-Length: 0x2\r\n\r\n{}", 400),
    "a Content-Length list": (P + b"Content-Length: 2, 2\r\n\r\n{}", 400),
    "an unknown Transfer-Encoding": (P + b"Transfer-Encoding: gzip\r\n\r\n", 501),
    "stacked Transfer-Encodings": (P + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501),
    "two Transfer-Encoding headers": (P + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
    "Transfer-Encoding on HTTP/1.0": (b"POST /v1/chat/completions HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    "a space before the colon": (P + b"Content-Length : 2\r\n\r\n{}", 400),
    "a NUL in a header": (P + b"X-A: a\x00b\r\nContent-Length: 2\r\n\r\n{}", 400),
    "a NUL in the target": (b"POST /v1/chat/completions\x00 HTTP/1.1\r\nHost: router\r\n\r\n", 400),
    "a chunk size not hex": (CHUNKED + b"zz\r\n{}\r\n0\r\n\r\n", 400),
    "a chunk size with 0x": (CHUNKED + b"0x2\r\n{}\r\n0\r\n\r\n", 400),
    "a chunk size with a blank": (CHUNKED + b" 2\r\n{}\r\n0\r\n\r\n", 400),
    "chunk data longer than its size": (CHUNKED + b"2\r\n{}}}\r\n0\r\n\r\n", 400),
    "a bare LF in a chunk extension": (CHUNKED + b"2;a\nb\r\n{}\r\n0\r\n\r\n", 400),
    "obs-fold": (P + b"X-A: 1\r\n folded\r\nContent-Length: 2\r\n\r\n{}", 400),
    "a malformed request line": (b"POST  /v1/chat/completions HTTP/1.1\r\nHost: router\r\n\r\n", 400),
    "bare LF line ends": (b"POST /v1/chat/completions HTTP/1.1\nHost: router\nContent-Length: 2\n\n{}", 400),
    "no Host on HTTP/1.1": (b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 400),
    "two Host headers": (P + b"Host: other\r\nContent-Length: 2\r\n\r\n{}", 400),
    "5000 header lines": (P + b"".join(b"X-%d: v\r\n" % i for i in range(5000)) + b"\r\n", 431),
    "a header line above 8190 bytes": (P + b"X-Long: " + b"y" * 9000 + b"\r\n\r\n", 431),
}


@pytest.mark.parametrize("name", list(CHECKS))
async def test_each_rfc9112_framing_check_is_refused_and_nothing_is_smuggled(
    make_stack: StackFactory, name: str
) -> None:
    raw, status = CHECKS[name]
    s = await make_stack()
    host, port = s.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(raw + SMUGGLED)
    answer = await asyncio.wait_for(reader.read(), 5.0)  # until the router closes
    writer.close()
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:200]
    assert len(re.findall(rb"HTTP/1\.1 \d{3} ", answer)) == 1, "a second answer: the smuggled request was served"
    assert b"Connection: close" in answer and b'"message":"' in answer  # named, then closed
    assert not s.prefill.requests and not s.decode.requests
