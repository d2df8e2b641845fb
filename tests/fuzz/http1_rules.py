"""Where the operator's http1.Connection deliberately reads the API server's answers otherwise
than h11 or llhttp (docs/fuzzing.md): as strictly as wire.py reads an engine's. Every one is
stricter: the call fails (ProtocolError, an ApiError to its caller), never misframed."""

from __future__ import annotations

import re

from pdx.controller.http1 import MAX_BODY

from .differ import CL_ZEROS, ReadCase, ReadRule, close_wins, http10_keep_alive, interim_close, te_ows, trailer_fields

BOTH = ("h11", "llhttp")
_CL_BIG = re.compile(rb"(?i)content-length:[ \t]*0*[1-9][0-9]{18}")


def _too_big(case: ReadCase) -> bool:
    got = case.ref.replies[case.at] if len(case.ref.replies) > case.at else None
    big = (got is not None and len(got.body) > MAX_BODY) or bool(_CL_BIG.search(case.data))
    return case.ours_failed("an answer above") and big


RULES: tuple[ReadRule, ...] = (
    ("status-line", BOTH, "HTTP/1.0 or 1.1, a status of 100-999 and a reason without controls, the line "
     "ended by CRLF; h11 takes any HTTP/d.d and bare LFs", lambda c: c.ours_failed("bad status line")),
    ("field-line", ("h11",), "a header is a token, a colon and a value without controls, ended by CRLF: no "
     "obs-fold, no bare CR or LF", lambda c: c.ours_failed("bad header line")),
    ("te-only-chunked", BOTH, "Transfer-Encoding is chunked, once, and never beside Content-Length",
     lambda c: c.ours_failed("only chunked, once", "Content-Length and Transfer-Encoding together")),
    ("cl-plain", ("h11",), "one plain decimal Content-Length, checked on every status (h11 takes '10, 10')",
     lambda c: c.ours_failed("bad Content-Length")),
    ("cl-zeros", ("h11",), "a Content-Length's leading zeros are read past h11's 20 digits",
     lambda c: c.ref_failed("bad Content-Length") and bool(CL_ZEROS.search(c.data))),
    ("chunk-size-line", ("h11",), "a chunk-size line is hex digits and extensions without controls",
     lambda c: c.ours_failed("bad chunk size line")),
    ("trailer", ("h11",), "trailers are field lines (h11 unfolds obs-fold and takes controls)",
     lambda c: c.ours_failed("bad trailer line")),
    ("chunk-ext-syntax", ("llhttp",), "chunk extensions are ignored, their syntax unchecked but for controls "
     "(as h11); llhttp checks their names and values", lambda c: c.ref_failed("chunk extension")),
    ("trailer-fields", BOTH, "trailers are read and dropped, never framing: llhttp refuses a Content-Length "
     "among them, h11 one it cannot read", trailer_fields),
    ("te-ows", ("llhttp",), "RFC 9110 §5.5: whitespace around a value is not part of it; llhttp keeps a "
     "trailing HTAB in Transfer-Encoding", te_ows),
    ("http10-keep-alive", ("h11",), "an HTTP/1.0 answer saying keep-alive keeps the connection (as "
     "llhttp); h11 closes every HTTP/1.0 one", http10_keep_alive),
    ("interim-close", ("llhttp",), "an interim answer (1xx) is skipped for the final one even when it says "
     "close (HTTP/1.0, Connection: close); llhttp takes it as the connection's last", interim_close),
    ("close-wins", ("llhttp",), "RFC 9112 §9.3: close ends the connection whatever else Connection says; "
     "llhttp keeps an HTTP/1.0 one that says keep-alive too", close_wins),
    ("answer-size", ("h11",), f"an answer above {MAX_BODY} bytes (a quarter of the operator's memory limit), or "
     "claiming to be, fails unread", _too_big),
)  # fmt: skip
