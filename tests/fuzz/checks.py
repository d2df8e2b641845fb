"""One check per fuzz target, shared by the tests (hypothesis, the corpus) and the long run
(scripts/fuzz.py): each raises AssertionError, naming what broke, or returns quietly."""

from __future__ import annotations

from collections.abc import Sequence

from . import front_driver, front_rules, http1_driver, http1_rules, wire_driver, wire_rules
from .differ import compare, compare_reads, same_framing
from .outcome import Read, Reply
from .refs import h11_requests, h11_responses, llhttp_requests, llhttp_responses
from .transport import pieces


def check_front(data: bytes, cuts: Sequence[int] = ()) -> None:
    """front.py frames a connection's bytes as h11 and llhttp do (or as a rule allows), the
    same however the socket splits them, without a crash or a hang."""
    whole = front_driver.serve([data])
    if cuts:
        split = front_driver.serve(pieces(data, cuts))
        assert same_framing(whole, split), f"front.py read {data[:300]!r} otherwise in reads {cuts}: {split}"
    compare(data, whole, h11_requests(data), "h11", front_rules.RULES)
    compare(data, whole, llhttp_requests(data), "llhttp", front_rules.RULES)


def _reused(read: Read) -> Read:
    """A reference's reading as wire.py's pool sees it: a connection is reused only when the
    answer kept it alive and nothing came after the answer."""
    if not read.replies:
        return read
    last = read.replies[0]
    return Read((Reply(last.status, last.body, last.keep and not read.rest),), read.end, read.detail, read.rest)


def check_wire(data: bytes, cuts: Sequence[int] = ()) -> None:
    """wire.py reads an engine's answer to a POST as h11 and llhttp do (or fails, as a rule
    allows), the same however the socket splits it, and fails only with its own errors."""
    whole = wire_driver.read([data])
    if cuts:
        split = wire_driver.read(pieces(data, cuts))
        assert (split.replies, split.end) == (whole.replies, whole.end), (
            f"wire.py read {data[:300]!r} otherwise in reads {cuts}: {split} against {whole}"
        )
    compare_reads(data, whole, _reused(h11_responses(data, [b"POST"])), "h11", wire_rules.RULES)
    compare_reads(data, whole, _reused(llhttp_responses(data, 1)), "llhttp", wire_rules.RULES)


def check_http1(data: bytes, methods: Sequence[str], cuts: Sequence[int] = ()) -> None:
    """The operator's Connection reads answers to these requests, one after another on one
    connection, as h11 does (and llhttp, when no HEAD is among them), or fails as a rule
    allows; only ConnectionErrors, and the same for any split."""
    ours = http1_driver.read(pieces(data, cuts), methods)
    asked = [m.encode() for m in methods]
    compare_reads(data, ours, h11_responses(data, asked), "h11", http1_rules.RULES)
    if "HEAD" not in methods:
        compare_reads(data, ours, llhttp_responses(data, len(methods)), "llhttp", http1_rules.RULES)
