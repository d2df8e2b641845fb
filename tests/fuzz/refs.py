"""The reference parsers, h11 (pure Python, the most literal reading of the RFCs) and llhttp
(Node's parser, through httptools), driven over whole byte streams into `outcome` shapes."""

from __future__ import annotations

from collections.abc import Sequence

import h11
import httptools

from .outcome import CLOSED, DONE, FAILED, PENDING, REFUSED, UPGRADE, WAITING, Message, Read, Reply, Served, norm_target

# h11 bounds an unfinished head at 16 KiB; above the router's 64 KiB, so that the router is
# the stricter of the two and its own bound is what a difference shows.
REF_HEAD_LIMIT = 1 << 20


def h11_requests(data: bytes) -> Served:
    """h11 as a server: each request answered (404, empty: no CONNECT or Upgrade takes the
    connection) before the next is read."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=REF_HEAD_LIMIT)
    if data:
        conn.receive_data(data)  # (no bytes would be the connection's end)
    out: list[Message] = []
    head: tuple[bytes, bytes, bytes] = (b"", b"", b"")
    body = bytearray()
    ahead = data  # the bytes from where the next request's line should start
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                return Served(tuple(out), WAITING)
            if isinstance(event, h11.Request):
                head = (bytes(event.method), norm_target(bytes(event.target)), bytes(event.http_version))
                body, ahead = bytearray(), b""
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                out.append(Message(*head, bytes(body)))
                conn.send(h11.Response(status_code=404, headers=[("Content-Length", "0")]))  # (no switch)
                conn.send(h11.EndOfMessage())
                if conn.their_state is not h11.DONE or conn.our_state is not h11.DONE:
                    return Served(tuple(out), CLOSED)
                conn.start_next_cycle()
                ahead = bytes(conn.trailing_data[0])
    except h11.RemoteProtocolError as exc:
        return Served(tuple(out), REFUSED, str(exc), ahead or bytes(conn.trailing_data[0]))


class _LlhttpServer:
    """httptools' callbacks, collecting requests."""

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.out: list[Message] = []
        self.url = bytearray()
        self.body = bytearray()
        self.inside = False
        self.closed = False

    def on_message_begin(self) -> None:
        self.inside, self.url, self.body = True, bytearray(), bytearray()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.inside = False
        method, version = self.parser.get_method(), self.parser.get_http_version().encode()
        self.out.append(Message(method, norm_target(bytes(self.url)), version, bytes(self.body)))
        self.closed = self.closed or not self.parser.should_keep_alive()


def llhttp_requests(data: bytes) -> Served:
    """llhttp as a server, in its strict default (no leniency flags)."""
    p = _LlhttpServer()
    try:
        p.parser.feed_data(data)
    except httptools.HttpParserUpgrade:
        return Served(tuple(p.out), UPGRADE)
    except httptools.HttpParserError as exc:
        if not p.closed:  # (after a closing message llhttp refuses any further byte)
            return Served(tuple(p.out), REFUSED, str(exc))
    return Served(tuple(p.out), CLOSED if p.closed else WAITING)


def h11_responses(data: bytes, methods: Sequence[bytes]) -> Read:
    """h11 as a client: one request per method, each answer read before the next is sent;
    the end of `data` is the server closing the connection."""
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=REF_HEAD_LIMIT)
    out: list[Reply] = []
    eof = False
    try:
        for i, method in enumerate(methods):
            headers = [("Host", "engine"), ("Content-Length", "2")]
            conn.send(h11.Request(method=method, target="/x", headers=headers))
            conn.send(h11.Data(data=b"{}"))
            conn.send(h11.EndOfMessage())
            if i == 0:
                conn.receive_data(data)
            status, body = 0, bytearray()
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    if eof:
                        return Read(tuple(out), FAILED, "closed before the answer's end")
                    conn.receive_data(b"")
                    eof = True
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    return Read(tuple(out), FAILED, "closed before the answer")
            keep = conn.their_state is h11.DONE and conn.our_state is h11.DONE and not eof
            rest = bool(conn.trailing_data[0])
            out.append(Reply(status, bytes(body), keep))
            if not keep:
                return Read(tuple(out), DONE, rest=rest)
            conn.start_next_cycle()
        return Read(tuple(out), DONE, rest=bool(conn.trailing_data[0]))
    except h11.RemoteProtocolError as exc:
        return Read(tuple(out), FAILED, str(exc))


class _LlhttpClient:
    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.out: list[Reply] = []
        self.body = bytearray()
        self.begun = 0  # messages begun, 1xx included
        self.begun_at: list[int] = []  # for each final answer, the messages begun by its end
        self.headed = False  # the message under way has its head

    def on_message_begin(self) -> None:
        self.body, self.headed = bytearray(), False
        self.begun += 1

    def on_headers_complete(self) -> None:
        self.headed = True

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.headed = False
        status = self.parser.get_status_code()
        if not 100 <= status < 200:
            self.out.append(Reply(status, bytes(self.body), self.parser.should_keep_alive()))
            self.begun_at.append(self.begun)


def llhttp_responses(data: bytes, wanted: int) -> Read:
    """llhttp as a client to POST requests (it cannot be told of a HEAD). httptools has no
    call for the connection's end (llhttp_finish), so an answer whose head came but not its
    end is PENDING: read until the close, or cut short; the caller accepts either reading."""
    p = _LlhttpClient()
    error = ""
    try:
        p.parser.feed_data(data)
    except httptools.HttpParserUpgrade:
        error = "upgrade"
    except httptools.HttpParserError as exc:
        error = str(exc)
    closed = next((i + 1 for i, r in enumerate(p.out) if not r.keep), wanted)  # (no answer after a close)
    take = min(wanted, closed)
    if len(p.out) >= take:
        return Read(tuple(p.out[:take]), DONE, rest=p.begun > p.begun_at[take - 1] or bool(error))
    if error:
        return Read(tuple(p.out), FAILED, error)
    if p.headed:
        last = Reply(p.parser.get_status_code(), bytes(p.body), False)
        return Read((*p.out, last), PENDING, "no end but the connection's")
    return Read(tuple(p.out), FAILED, "closed before the answer's end")
