"""HTTP/1.1 byte streams to fuzz with: messages built from the grammar's parts and from the
forms parsers get wrong (RFC 9112's edges, the smuggling papers' cases), pipelined, and
then, some of the time, mutated byte by byte. Kept small, but now and then at the bounds."""

from __future__ import annotations

from .draw import Draw

TOKEN_BYTES = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
SPECIAL = b"\r\n\x00 \t:;,0aA\x80\xff\x7f\x0b\"/?=-"
EOLS = (b"\r\n",) * 12 + (b"\n", b"\r", b"\r\r\n", b"\n\r")

METHODS = (b"GET", b"POST", b"POST", b"PUT", b"HEAD", b"DELETE", b"OPTIONS", b"PATCH", b"FOO", b"get", b"CONNECT")
TARGETS = (
    b"/echo", b"/v1/chat/completions", b"/echo?q=1&r=%20", b"/", b"/echo?", b"*", b"http://x/echo",
    b"x.example:80", b"/\xc3\xa9", b'/a"b', b"/a#f", b"/a{b}", b"//x", b"/a\tb", b"/a\x00", b"",
)  # fmt: skip
VERSIONS = (b"HTTP/1.1",) * 10 + (b"HTTP/1.0", b"HTTP/1.0", b"HTTP/1.2", b"HTTP/2.0", b"http/1.1", b"HTTP/1")
STATUSES = (b"200 OK",) * 8 + (
    b"204 No Content", b"304 Not Modified", b"100 Continue", b"103 Early Hints", b"101 Switching Protocols",
    b"404 Not Found", b"500 Internal Server Error", b"200", b"200 ", b"099 x", b"600 x", b"20 x", b"2000 x",
    b"200 \xc3\xa9", b"200 a\x01b", b"abc OK",
)  # fmt: skip
CONNECTION = (b"close", b"keep-alive", b"Close", b"closed", b"keep-alive, close", b"upgrade", b"close, x", b"")
TE = (b"chunked",) * 6 + (
    b"Chunked", b"chunked ", b"gzip, chunked", b"chunked, gzip", b"identity", b"", b"chunked,", b",chunked", b"x",
    b"chunked, chunked", b"\x0bchunked",
)  # fmt: skip
NAME_FORMS = (b"%s", b"%s", b"%s", b"LOWER", b"UPPER", b"%s ", b" %s", b"%s\t", b"X-%s")


def _name(d: Draw, name: bytes) -> bytes:
    form = d.choice(NAME_FORMS)
    if form == b"LOWER":
        return name.lower()
    if form == b"UPPER":
        return name.upper()
    return form % name


def _line(d: Draw, name: bytes, value: bytes) -> bytes:
    sep = d.choice((b": ", b": ", b": ", b":", b":\t", b": \t "))
    tail = d.choice((b"", b"", b"", b"", b" ", b"\t"))
    return _name(d, name) + sep + value + tail + d.choice(EOLS)


def _length(d: Draw, n: int) -> bytes:
    return d.choice(
        (b"%d" % n,) * 6
        + (b"0%d" % n, b"+%d" % n, b"-%d" % n, b"%d, %d" % (n, n), b"%d,%d" % (n, n + 1), b" %d" % n, b"0x%x" % n)
        + (b"%d_0" % n, b"", b"%d" % (n + 1), b"%d" % max(n - 1, 0), b"99999999999999999999", b"1e3", b"%d.0" % n)
        + (b"9" * 4400, b"0" * 4400 + b"%d" % n, b"\xb2", b"%d\xb9" % n)
    )


def _size_line(d: Draw, size: int) -> bytes:
    hexed = d.choice((b"%x", b"%x", b"%x", b"%X", b"0%x", b"00000000000000000%x")) % size
    return d.choice((b"%s", b"%s", b"%s", b"%s;ext", b"%s;a=b", b'%s;a="x;y"', b"%s ;a", b" %s", b"%s ")) % hexed + (
        d.choice((b"", b"", b"", b"", b"", b"\x01", b"\n", b";\x00", b";\x80"))
    )


def chunked(d: Draw, body: bytes) -> bytes:
    """body in chunks, with the framing's edges: sizes, extensions, CRLFs, trailers."""
    out, pos = [], 0
    while pos < len(body):
        n = d.integer(1, max(1, len(body) - pos))
        said = d.choice((n,) * 8 + (n + 1, n - 1))
        out.append(_size_line(d, said) + d.choice(EOLS) + body[pos : pos + n])
        out.append(d.choice((b"\r\n",) * 10 + (b"\n", b"", b"XX", b"\r")))
        pos += n
    out.append(d.choice((b"0", b"0", b"0", b"000", b"0;x=y", b" 0", b"0 ")) + d.choice(EOLS))
    for _ in range(d.choice((0, 0, 0, 1, 2))):
        out.append(d.choice((b"X-T: v", b"Content-Length: 5", b"garbage", b"X-T:\x01", b" folded", b"X: y")))
        out.append(d.choice(EOLS))
    out.append(d.choice(EOLS))
    return b"".join(out)


def _value(d: Draw, name: bytes) -> bytes:
    if name == b"Connection":
        return d.choice(CONNECTION)
    if name == b"Transfer-Encoding":
        return d.choice(TE)
    if name in (b"Expect", b"Upgrade"):
        return b"100-continue" if name == b"Expect" else b"websocket"
    return d.choice((b"v", b"a b", b"\x80\xff", b"a\x01b", b"a\x7fb", b"", b"a\x00b", b"x" * 40))


def _headers(d: Draw, body: bytes, request: bool) -> tuple[list[bytes], bytes]:
    """Header lines and the body's framed bytes, in the framing the headers ask for (or not)."""
    lines: list[bytes] = []
    if request and d.chance(0.95):
        lines.append(_line(d, b"Host", d.choice((b"a", b"a", b"a:80", b"", b"a b", b"\x80"))))
    if request and d.chance(0.03):
        lines.append(_line(d, b"Host", b"b"))
    framing = d.choice(("length", "length", "chunked", "chunked", "none", "both", "twice"))
    framed = body
    if framing in ("length", "both"):
        lines.append(_line(d, b"Content-Length", _length(d, len(body))))
    if framing == "twice":
        lines += [_line(d, b"Content-Length", _length(d, len(body))) for _ in range(2)]
    if framing in ("chunked", "both"):
        lines.append(_line(d, b"Transfer-Encoding", d.choice(TE)))
        framed = chunked(d, body)
    if framing == "none" and not request and d.chance(0.5):
        framed = body  # read until the connection closes
    elif framing == "none":
        framed = b""
    for _ in range(d.choice((0, 0, 1, 1, 2, 3))):
        name = d.choice((b"Connection", b"X-A", b"Content-Type", b"Expect", b"Upgrade", b"Transfer-Encoding"))
        value = _value(d, name)
        at = d.integer(0, len(lines))
        lines.insert(at, _line(d, name, value))
    if d.chance(0.03):
        odd = d.choice((b" folded", b"\tfolded", b"Bad Name: 1", b": x", b"X"))
        lines.insert(d.integer(0, len(lines)), odd + b"\r\n")
    if d.chance(0.02):  # at the bounds: many lines, a long line, a long head
        many = d.choice((95, 98, 99, 100, 101, 120))
        lines += [b"X-%d: v\r\n" % i for i in range(many)]
    if d.chance(0.01):
        lines.append(b"X-Long: " + b"y" * d.choice((8170, 8180, 8181, 8182, 9000)) + b"\r\n")
    if d.chance(0.005):
        lines += [b"X-Big-%d: " % i + b"z" * 4000 + b"\r\n" for i in range(d.choice((15, 16, 17)))]
    return lines, framed


def request(d: Draw) -> bytes:
    """One request: line, headers, body."""
    method = d.choice(METHODS)
    target = d.choice(TARGETS)
    if d.chance(0.1):
        target = b"/" + bytes(d.choice(TOKEN_BYTES + b"/?=&%") for _ in range(d.integer(0, 12)))
    first = method + b" " + target + b" " + d.choice(VERSIONS)
    if d.chance(0.03):
        first = d.choice((b"GET  / HTTP/1.1", b"GET / HTTP/1.1 ", b" GET / HTTP/1.1", b"GET /", b"GET\t/ HTTP/1.1"))
    body = d.choice((b"", b"", b"hello", b'{"a":1}', b"0\r\n\r\n", b"x" * d.integer(0, 300)))
    lines, framed = _headers(d, body, request=True)
    return first + d.choice(EOLS) + b"".join(lines) + d.choice(EOLS) + framed


def response(d: Draw) -> bytes:
    """One answer: status line, headers, body."""
    version = d.choice((b"HTTP/1.1",) * 8 + (b"HTTP/1.0", b"HTTP/1.2", b"HTTP/2", b"http/1.1", b"HTTP/1.1 "))
    first = version + b" " + d.choice(STATUSES)
    body = d.choice((b"", b'{"a":1}', b"data: {}\n\n", b"x" * d.integer(0, 300)))
    lines, framed = _headers(d, body, request=False)
    return first + d.choice(EOLS) + b"".join(lines) + d.choice(EOLS) + framed


def mutate(d: Draw, data: bytes) -> bytes:
    """A few byte-level edits: insert, delete, replace, duplicate a span, or cut."""
    buf = bytearray(data)
    for _ in range(d.integer(1, 4)):
        at = d.integer(0, len(buf))
        how = d.choice(("insert", "delete", "replace", "replace", "span", "cut"))
        byte = d.choice(SPECIAL) if d.chance(0.8) else d.integer(0, 255)
        if how == "insert":
            buf[at:at] = bytes([byte])
        elif how == "delete" and at < len(buf):
            del buf[at]
        elif how == "replace" and at < len(buf):
            buf[at] = byte
        elif how == "span" and buf:
            a = d.integer(0, len(buf) - 1)
            buf[at:at] = buf[a : a + d.integer(1, 16)]
        elif how == "cut":
            del buf[at:]
    return bytes(buf)


def stream(d: Draw, one: bool = False, answers: bool = False) -> bytes:
    """One or a few messages back to back (empty lines between some), mutated some of the time."""
    make = response if answers else request
    parts = []
    for _ in range(1 if one else d.choice((1, 1, 2, 2, 3))):
        if d.chance(0.1):
            parts.append(d.choice((b"\r\n", b"\n", b"\r\n\r\n", b"\r")))
        parts.append(make(d))
    data = b"".join(parts)
    return mutate(d, data) if d.chance(0.4) else data


def cuts(d: Draw, data: bytes) -> list[int]:
    """Where the socket splits the bytes into reads."""
    if not data or d.chance(0.3):
        return []
    if d.chance(0.05):
        return list(range(1, len(data)))  # a byte at a time
    return [d.integer(1, len(data)) for _ in range(d.integer(1, 4))]
