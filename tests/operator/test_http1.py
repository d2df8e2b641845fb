"""The operator's HTTP/1.1 connection reads every body framing an API server may answer with,
and a kept-alive connection the server closed is sent on again, once."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pdx.controller.http1 import Connection, ProtocolError, Stale
from pdx.controller.kube import ApiError, Kube

# request head -> (raw answer, close after it); None closes unanswered
Answer = Callable[[bytes], tuple[bytes, bool] | None]


@pytest.fixture
def serve() -> Iterator[Callable[[list[Answer]], tuple[int, list[bytes]]]]:
    """A server answering each request with the next script entry, on one connection until
    an entry closes it; the port, and the request heads it read."""
    socks: list[socket.socket] = []

    def start(script: list[Answer]) -> tuple[int, list[bytes]]:
        listener = socket.create_server(("127.0.0.1", 0))
        socks.append(listener)
        seen: list[bytes] = []

        def run() -> None:
            steps = iter(script)
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                with conn:
                    buf = b""
                    while True:
                        while b"\r\n\r\n" not in buf:
                            got = conn.recv(65536)
                            if not got:
                                break
                            buf += got
                        if b"\r\n\r\n" not in buf:
                            break
                        head, buf = buf.split(b"\r\n\r\n", 1)
                        lengths = [h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")]
                        length = int(lengths[0].split(b":")[1]) if lengths else 0
                        while len(buf) < length:
                            buf += conn.recv(65536)
                        buf = buf[length:]
                        seen.append(head)
                        answer = next(steps)(head)
                        if answer is None:
                            break
                        conn.sendall(answer[0])
                        if answer[1]:
                            break

        threading.Thread(target=run, daemon=True).start()
        return listener.getsockname()[1], seen

    yield start
    for s in socks:
        s.close()


def _ok(body: bytes, extra: bytes = b"") -> Answer:
    return lambda _head: (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%b\r\n%b" % (len(body), extra, body), False)


def _raw(answer: bytes, close: bool = False) -> Answer:
    return lambda _head: (answer, close)


def test_content_length_chunked_and_close_delimited_bodies_are_read_whole(serve: Callable[..., Any]) -> None:
    chunked = b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\n{"a":\r\n3\r\n 1}\r\n0\r\nT: v\r\n\r\n'
    interim = b"HTTP/1.1 100 Continue\r\n\r\n"
    port, seen = serve(
        [
            _ok(b'{"n":1}'),
            _raw(chunked),
            _raw(interim + b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}"),
            _raw(b"HTTP/1.1 204 No Content\r\n\r\n"),
            _raw(b'HTTP/1.0 200 OK\r\n\r\n{"end":true}', close=True),  # delimited by the close
        ]
    )
    conn = Connection("127.0.0.1", port, 5.0)
    assert conn.request("GET", "/a", None, {"Accept": "application/json"}) == (200, b'{"n":1}')
    assert conn.request("PATCH", "/b", b'{"x":1}', {}) == (200, b'{"a": 1}')
    assert conn.request("POST", "/c", b"{}", {}) == (201, b"{}")
    assert conn.request("DELETE", "/d", None, {}) == (204, b"")
    assert conn.request("GET", "/e", None, {}) == (200, b'{"end":true}')
    assert len(seen) == 5  # all five on the one kept-alive connection
    assert seen[1].startswith(b"PATCH /b HTTP/1.1\r\nHost: 127.0.0.1:") and b"Content-Length: 7" in seen[1]


def test_a_reused_connection_closed_unanswered_is_stale_a_fresh_one_is_an_error(serve: Callable[..., Any]) -> None:
    port, _ = serve([_ok(b"1"), lambda _h: None, lambda _h: None])
    conn = Connection("127.0.0.1", port, 5.0)
    assert conn.request("GET", "/", None, {}) == (200, b"1")
    with pytest.raises(Stale):
        conn.request("GET", "/", None, {})
    with pytest.raises(ProtocolError):  # a new connection that answers nothing is no stale one
        conn.request("GET", "/", None, {})


def test_kube_sends_again_on_a_new_connection_after_a_stale_one(serve: Callable[..., Any]) -> None:
    from kubernetes import client as k8s_client

    port, seen = serve([_ok(b'{"a":1}'), lambda _h: None, _ok(b'{"a":2}'), _ok(b"", b"Connection: close\r\n")])
    kube = Kube(k8s_client.ApiClient(k8s_client.Configuration(host=f"http://127.0.0.1:{port}")))
    assert kube.call("GET", "/one") == {"a": 1}
    assert kube.call("GET", "/two") == {"a": 2}  # the first try found the connection closed
    assert [h.split(b" ")[1] for h in seen] == [b"/one", b"/two", b"/two"]
    assert kube.call("GET", "/three") is None


def test_a_cut_body_is_a_transport_error_naming_the_request(serve: Callable[..., Any]) -> None:
    from kubernetes import client as k8s_client

    port, _ = serve([_raw(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}", close=True)])
    kube = Kube(k8s_client.ApiClient(k8s_client.Configuration(host=f"http://127.0.0.1:{port}")))
    with pytest.raises(ApiError) as err:
        kube.call("GET", "/cut")
    assert err.value.status == 0 and "GET /cut" in str(err.value) and "cut short" in str(err.value)


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n", "bad Content-Length"),  # was a ValueError
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n{}", "bad Content-Length"),  # was: read to the close
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1_0\r\n\r\n{}", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n", "an answer above"),  # was MemoryError
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\n\r\n{}", "an answer above"),  # 1 TiB: nothing allocated
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\n{}\r\n0\r\n\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-2\r\n{}\r\n0\r\n\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n", "no CRLF after"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: notchunked\r\n\r\n{}", "only chunked"),
        (b"HTTP/1.1 200 OK\r\n Content-Length: 2\r\n\r\n{}", "bad header line"),  # obs-fold
        (b"HTTP/1.1 200 OK\nContent-Length: 2\n\n{}", "bad status line"),  # bare LF
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", "no upgrade"),
    ],
)
def test_an_answer_read_more_loosely_by_others_is_a_protocol_error(
    serve: Callable[..., Any], answer: bytes, why: str
) -> None:
    port, _ = serve([_raw(answer, close=True)])
    with pytest.raises(ProtocolError, match=why):
        Connection("127.0.0.1", port, 5.0).request("GET", "/", None, {})


def test_a_close_among_connection_options_closes_the_connection(serve: Callable[..., Any]) -> None:
    port, _ = serve([_ok(b"1", b"Connection: keep-alive, close\r\n"), _ok(b"2")])
    conn = Connection("127.0.0.1", port, 5.0)
    assert conn.request("GET", "/", None, {}) == (200, b"1")
    assert conn._sock is None  # closed after it: the next request opens a new connection
