"""Where front.py deliberately reads requests otherwise than h11 or llhttp (docs/fuzzing.md)."""

from __future__ import annotations

from .differ import CL_ZEROS, TE_TAB, Case, Rule
from .front_driver import MAX_BODY, serve
from .outcome import CLOSED, REFUSED, UPGRADE, WAITING

BOTH = ("h11", "llhttp")
# llhttp's methods (llhttp/src/llhttp/constants.ts, METHODS_HTTP): any other token it refuses.
LLHTTP_METHODS = frozenset(
    b"DELETE GET HEAD POST PUT CONNECT OPTIONS TRACE COPY LOCK MKCOL MOVE PROPFIND PROPPATCH SEARCH UNLOCK BIND "
    b"REBIND UNBIND ACL REPORT MKACTIVITY CHECKOUT MERGE M-SEARCH NOTIFY SUBSCRIBE UNSUBSCRIBE PATCH PURGE "
    b"MKCALENDAR LINK UNLINK SOURCE QUERY".split()
)


def _too_big(case: Case) -> bool:
    """We refused a body above maxRequestBytes: the reference took one as long, or waits for it."""
    got = case.ref_message()
    return case.ours_refused("maxRequestBytes") and (got is None or len(got.body) > MAX_BODY)


def _http10_close(case: Case) -> bool:
    """h11 closed after an HTTP/1.0 request that asked to be kept alive; we kept it."""
    before = case.previous()
    return case.ref_stopped and case.ref.end == CLOSED and before is not None and before.version == b"1.0"


def _close_wins(case: Case) -> bool:
    """We closed after an HTTP/1.0 request; llhttp read on."""
    before = case.previous()
    ref_on = not case.ref_stopped or case.ref.end != CLOSED
    return case.ours_stopped and case.ours.end == CLOSED and ref_on and before is not None and before.version == b"1.0"


def _judged_whole(case: Case) -> bool:
    """The reference refused a head before its end, or took a line ended by a bare LF; we wait
    for the line's CRLF, and refuse what we waited for once it comes."""
    if not (case.ours_stopped and case.ours.end == WAITING and (case.ref.end == REFUSED or not case.ref_stopped)):
        return False
    whole = serve([case.data + b"\r\n\r\n"])
    return whole.end == REFUSED and whole.messages == case.ours.messages


def _upgrade(case: Case) -> bool:
    """llhttp gave the connection away after a CONNECT or Upgrade request's head; we served it."""
    if case.ref.end != UPGRADE or case.at < len(case.ref.messages) - 1:
        return False
    ref, ours = case.ref_message(), case.ours_message()
    if ref is not None and ours is not None:  # (a CONNECT's body: llhttp reads none)
        return (ref.method, ref.target, ref.version) == (ours.method, ours.target, ours.version)
    return True


def _trailer_fields(case: Case) -> bool:
    """A Content-Length among the trailers: we drop it (or wait for the trailers' end)."""
    ours_on = not case.ours_stopped or case.ours.end == WAITING
    return ours_on and case.ref_refused("Content-Length can't be", "bad Content-Length", "conflicting Content-Length")


def _te_ows(case: Case) -> bool:
    return case.ref_refused("invalid `Transfer") and bool(TE_TAB.search(case.data))


def _method(case: Case) -> bool:
    got = case.ours_message()
    refused = case.ref_refused("Invalid method", "Expected space after method")
    return refused and (got is None or got.method not in LLHTTP_METHODS)


def _empty_lines(case: Case) -> bool:
    """h11 refuses empty lines (or a CR or LF) before a request line, which RFC 9112 §2.2
    says to ignore: where it stopped, the bytes left start with one."""
    refused = case.ref_refused("no request line received", "illegal request line")
    return refused and case.ref.rest[:1] in (b"\r", b"\n")


RULES: tuple[Rule, ...] = (
    Rule("host-required", ("llhttp",), "RFC 9112 §3.2: an HTTP/1.1 request without Host is a 400 (llhttp: no check)",
         lambda c: c.ours_refused("needs a Host header")),
    Rule("host-twice", ("llhttp",), "RFC 9112 §3.2: two Host headers are a 400",
         lambda c: c.ours_refused("Host header is sent")),
    Rule("header-count", BOTH, "at most 100 header lines (431); neither reference counts them",
         lambda c: c.ours_refused("header lines, above")),
    Rule("line-length", BOTH, "a request or header line above 8190 bytes is a 431 (aiohttp's bound, kept)",
         lambda c: c.ours_refused("above 8190 bytes")),
    Rule("head-size", BOTH, "a head above 64 KiB is a 431 (h11's bound is 16 KiB, llhttp has none)",
         lambda c: c.ours_refused("head is above")),
    Rule("body-size", BOTH, "a body above maxRequestBytes is a 413, by policy", _too_big),
    Rule("cl-and-te", ("h11",), "RFC 9112 §6.3: Content-Length with Transfer-Encoding is refused (h11: chunked wins)",
         lambda c: c.ours_refused("Content-Length and Transfer-Encoding together")),
    Rule("cl-plain", ("h11",), "Content-Length is one decimal number; h11 takes a list of equal ones ('5, 5')",
         lambda c: c.ours_refused("Content-Length must be one decimal number")),
    Rule("te-http10", BOTH, "RFC 9112 §6.1: Transfer-Encoding in an HTTP/1.0 request is faulty framing (400)",
         lambda c: c.ours_refused("in an HTTP/1.0 request")),
    Rule("te-codings", ("llhttp",), "RFC 9112 §6.1: a coding other than chunked is a 501; llhttp frames a "
         "body by its final chunked", lambda c: c.ours_refused("only Transfer-Encoding")),
    Rule("control-in-value", ("h11",), "RFC 9110 §5.5: controls but HTAB in a field value are refused; h11 takes them",
         lambda c: c.ours_refused("holds a control character")),
    Rule("obs-fold", ("h11",), "RFC 9112 §5.2 lets a server refuse obs-fold (400); h11 unfolds it",
         lambda c: c.ours_refused("folded lines are refused")),
    Rule("version", BOTH, "only HTTP/1.0 and HTTP/1.1; h11 takes any HTTP/d.d, llhttp HTTP/2.0 and 0.9 too",
         lambda c: c.ours_refused("not an HTTP/1.x request line")),
    Rule("origin-form", BOTH, "a request target is a path: no absolute, authority or asterisk form (no proxying)",
         lambda c: c.ours_refused("origin form")),
    Rule("bare-eol", BOTH, "RFC 9112 §2.2: lines end in CRLF; a bare CR or LF is refused (h11 takes a bare LF)",
         lambda c: c.ours_refused("a bare CR or LF")),
    Rule("chunk-size-line", ("h11",), "a chunk-size line is hex digits and extensions without controls; h11 takes "
         "whitespace after the size and any byte in extensions", lambda c: c.ours_refused("bad chunk size")),
    Rule("chunk-line-length", BOTH, "a chunk-size line above 4096 bytes is refused",
         lambda c: c.ours_refused("a size line without its end")),
    Rule("trailer", ("h11",), "trailers are field lines: no obs-fold, no controls (h11 unfolds and takes them)",
         lambda c: c.ours_refused("a trailer that is not a field line")),
    Rule("chunk-ext-syntax", ("llhttp",), "chunk extensions are ignored, their syntax unchecked but for "
         "controls (as h11); llhttp checks their names and values", lambda c: c.ref_refused("chunk extension")),
    Rule("method-token", ("llhttp",), "RFC 9110 §9.1: a method is any token; llhttp knows a fixed list", _method),
    Rule("cl-zeros", ("h11",), "a Content-Length's leading zeros are read past h11's 20 digits",
         lambda c: c.ref_refused("bad Content-Length") and bool(CL_ZEROS.search(c.data))),
    Rule("cl-duplicate", ("llhttp",), "RFC 9110 §8.6: repeated identical Content-Length values are taken as one",
         lambda c: c.ref_refused("Duplicate Content-Length")),
    Rule("trailer-fields", BOTH, "trailers are read and dropped, never framing: llhttp refuses a "
         "Content-Length among them, h11 one it cannot read", _trailer_fields),
    Rule("te-ows", ("llhttp",), "RFC 9110 §5.5: whitespace around a value is not part of it; llhttp keeps a "
         "trailing HTAB in Transfer-Encoding", _te_ows),
    Rule("empty-lines", ("h11",), "RFC 9112 §2.2: empty lines before a request line are ignored", _empty_lines),
    Rule("http10-keep-alive", ("h11",), "an HTTP/1.0 request with Connection: keep-alive keeps the connection "
         "(as llhttp); h11 closes every HTTP/1.0 one", _http10_close),
    Rule("close-wins", ("llhttp",), "RFC 9112 §9.3: close ends the connection whatever else Connection says; "
         "llhttp keeps an HTTP/1.0 one that says keep-alive too", _close_wins),
    Rule("upgrade", ("llhttp",), "no protocol switch: CONNECT and Upgrade requests are served as any other",
         _upgrade),
    Rule("judged-whole", BOTH, "a head or chunked line is judged when its CRLF comes (or at a bound); a "
         "reference may refuse it from its first bad byte, or take a bare LF", _judged_whole),
)  # fmt: skip

