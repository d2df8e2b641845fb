"""Where wire.py deliberately reads an engine's answer otherwise than h11 or llhttp
(docs/fuzzing.md). Every one is stricter: the answer fails (a named 502), never misframed."""

from __future__ import annotations

from .differ import CL_ZEROS, ReadCase, ReadRule, close_wins, http10_keep_alive, interim_close, te_ows, trailer_fields
from .outcome import FAILED
from .wire_driver import read

BOTH = ("h11", "llhttp")


def _cl_zeros(case: ReadCase) -> bool:
    """h11 refuses a Content-Length above 20 digits, leading zeros counted; we take its value."""
    return case.ref_failed("bad Content-Length") and bool(CL_ZEROS.search(case.data))


def _crlf_after(case: ReadCase) -> bool:
    """We dropped a connection that sent a byte after the answer: llhttp skips CR and LF
    between messages (so keeps it), we reuse only one that sent nothing more."""
    if case.at != len(case.ours.replies) - 1 or len(case.ref.replies) <= case.at:
        return False
    ours, ref = case.ours.replies[case.at], case.ref.replies[case.at]
    same = (ours.status, ours.body) == (ref.status, ref.body)
    return same and not ours.keep and ref.keep and case.data.endswith((b"\r", b"\n"))


def _judged_whole(case: ReadCase) -> bool:
    """The connection ended before a line's CRLF (the reference took a bare LF for one); with
    CRLFs to end it, we refuse the line."""
    if not case.ours_failed("the engine closed the connection"):
        return False
    whole = read([case.data + b"\r\n\r\n"])
    return whole.end == FAILED and "closed the connection" not in whole.detail


RULES: tuple[ReadRule, ...] = (
    ("status-line", BOTH, "HTTP/1.0 or 1.1, a status of 100-999 and a reason without controls, nothing before "
     "it; h11 takes any HTTP/d.d, llhttp skips empty lines first", lambda c: c.ours_failed("status line")),
    ("field-line", BOTH, "a header is a token, a colon and a value without controls: no obs-fold, no bare CR "
     "or LF (h11 takes these, llhttp some)", lambda c: c.ours_failed("unreadable header line", "a bare CR or LF")),
    ("te-only-chunked", BOTH, "Transfer-Encoding is chunked, alone and without Content-Length; llhttp reads "
     "other codings to the close, h11 lets chunked win over Content-Length", lambda c: c.ours_failed("only chunked")),
    ("cl-plain", ("h11",), "one plain decimal Content-Length, checked on every status (h11 takes '10, 10')",
     lambda c: c.ours_failed("bad Content-Length", "digits: above")),
    ("chunk-size-line", ("h11",), "a chunk-size line is hex digits and extensions without controls",
     lambda c: c.ours_failed("bad chunk size")),
    ("trailer", ("h11",), "trailers are field lines (h11 unfolds obs-fold and takes controls)",
     lambda c: c.ours_failed("a trailer that is not a field line")),
    ("te-ows", ("llhttp",), "RFC 9110 §5.5: whitespace around a value is not part of it; llhttp keeps a "
     "trailing HTAB in Transfer-Encoding", te_ows),
    ("cl-zeros", ("h11",), "a Content-Length's leading zeros are read past h11's 20 digits", _cl_zeros),
    ("no-byte-after", ("llhttp",), "a connection that sent anything after the answer, even a CRLF, is not "
     "reused", _crlf_after),
    ("trailer-fields", BOTH, "trailers are read and dropped, never framing: llhttp refuses a Content-Length "
     "among them, h11 one it cannot read", trailer_fields),
    ("head-size", BOTH, "answer headers above 64 KiB fail (h11 is given 1 MiB here, llhttp has no bound)",
     lambda c: c.ours_failed("answer headers above")),
    ("judged-whole", ("h11",), "a line is read up to its CRLF: the reference may take a bare LF", _judged_whole),
    ("chunk-ext-syntax", ("llhttp",), "chunk extensions are ignored, their syntax unchecked but for controls "
     "(as h11); llhttp checks their names and values", lambda c: c.ref_failed("chunk extension")),
    ("http10-keep-alive", ("h11",), "an HTTP/1.0 answer saying keep-alive keeps the connection (as "
     "llhttp); h11 closes every HTTP/1.0 one", http10_keep_alive),
    ("interim-close", ("llhttp",), "an interim answer (1xx) is skipped for the final one even when it says "
     "close (HTTP/1.0, Connection: close); llhttp takes it as the connection's last", interim_close),
    ("close-wins", ("llhttp",), "RFC 9112 §9.3: close ends the connection whatever else Connection says; "
     "llhttp keeps an HTTP/1.0 one that says keep-alive too", close_wins),
)  # fmt: skip
