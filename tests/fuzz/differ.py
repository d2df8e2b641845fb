"""The differential check: where the router's codec and a reference part ways on the same
bytes, the first message at which they do, and whether a documented rule allows it.

A rule names a deliberate difference (docs/fuzzing.md lists each with its reason) and a
predicate precise enough that it cannot hide another: a refusal is matched by the router's
own error message, a looser reading by the reference's error and what the router took."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from .outcome import DONE, FAILED, PENDING, REFUSED, Message, Read, Served

HITS: Counter[str] = Counter()  # rule name -> times it allowed a difference (this process)


class Disagreement(AssertionError):
    """A framing difference no rule allows."""


@dataclass(frozen=True)
class Case:
    """Our reading and the reference's of one byte stream, from the first message they part at."""

    data: bytes
    ours: Served
    ref: Served
    at: int

    @property
    def ours_stopped(self) -> bool:
        return self.at == len(self.ours.messages)

    @property
    def ref_stopped(self) -> bool:
        return self.at == len(self.ref.messages)

    def ours_refused(self, *phrases: str) -> bool:
        """We refused message `at` saying one of `phrases`; the reference did not refuse it."""
        if not (self.ours_stopped and self.ours.end == REFUSED):
            return False
        if self.ref_stopped and self.ref.end == REFUSED:
            return False
        return any(p in self.ours.detail for p in phrases)

    def ref_refused(self, *phrases: str) -> bool:
        """The reference refused message `at` saying one of `phrases`; we did not."""
        if not (self.ref_stopped and self.ref.end == REFUSED):
            return False
        if self.ours_stopped and self.ours.end == REFUSED:
            return False
        return any(p in self.ref.detail for p in phrases)

    def ref_message(self) -> Message | None:
        return self.ref.messages[self.at] if self.at < len(self.ref.messages) else None

    def ours_message(self) -> Message | None:
        return self.ours.messages[self.at] if self.at < len(self.ours.messages) else None

    def previous(self) -> Message | None:
        return self.ours.messages[self.at - 1] if self.at else None


@dataclass(frozen=True)
class Rule:
    name: str
    against: tuple[str, ...]  # the references it is a difference from
    reason: str
    holds: Callable[[Case], bool]


def compare(data: bytes, ours: Served, ref: Served, reference: str, rules: tuple[Rule, ...]) -> str | None:
    """None when both read the same messages and ended alike; else the name of the rule that
    allows the difference. Raises Disagreement when none does."""
    if ours.messages == ref.messages and ours.end == ref.end:
        return None
    at = 0
    while at < min(len(ours.messages), len(ref.messages)) and ours.messages[at] == ref.messages[at]:
        at += 1
    case = Case(data, ours, ref, at)
    for rule in rules:
        if reference in rule.against and rule.holds(case):
            HITS[f"{reference}: {rule.name}"] += 1
            return rule.name
    raise Disagreement(
        f"the router and {reference} part at message {at} of {data[:600]!r}\n  ours: {ours}\n  {reference}: {ref}"
    )


@dataclass(frozen=True)
class ReadCase:
    """A client's reading of answers and the reference's, from the first answer they part at."""

    data: bytes
    ours: Read
    ref: Read
    at: int

    def ours_failed(self, *phrases: str) -> bool:
        """We failed at answer `at` saying one of `phrases`; the reference read it."""
        pending = self.ref.end == PENDING and self.at == len(self.ref.replies) - 1  # (not read whole)
        took = len(self.ref.replies) > self.at and not pending
        return (
            self.ours.end == FAILED
            and len(self.ours.replies) == self.at
            and took
            and (any(p in self.ours.detail for p in phrases))
        )

    def ref_failed(self, *phrases: str) -> bool:
        """The reference failed at answer `at` saying one of `phrases`; we read it."""
        took = len(self.ours.replies) > self.at
        return (
            self.ref.end == FAILED
            and len(self.ref.replies) == self.at
            and took
            and (any(p in self.ref.detail for p in phrases))
        )


ReadRule = tuple[str, tuple[str, ...], str, Callable[[ReadCase], bool]]  # name, against, reason, holds
_CLOSE = re.compile(rb"(?i)\r\nconnection:[^\r\n]*\bclose\b")
TE_TAB = re.compile(rb"(?i)\r\ntransfer-encoding:[ \t]*chunked[ \t]*\t[ \t]*\r\n")
CL_ZEROS = re.compile(rb"(?i)content-length:[ \t]*0[0-9]{20,}")  # (h11 refuses above 20 digits)


_KEEP_ALIVE = re.compile(rb"(?i)\r\nconnection:[^\r\n]*\bkeep-alive\b")


def http10_keep_alive(case: ReadCase) -> bool:
    """We kept alive an HTTP/1.0 answer's connection that said keep-alive (as llhttp does);
    h11 closes every HTTP/1.0 one."""
    if len(case.ours.replies) <= case.at or len(case.ref.replies) <= case.at:
        return False
    ours, ref = case.ours.replies[case.at], case.ref.replies[case.at]
    same = (ours.status, ours.body) == (ref.status, ref.body)
    answered_10 = b"HTTP/1.0 " in case.data and bool(_KEEP_ALIVE.search(case.data))
    return same and ours.keep and not ref.keep and answered_10


def te_ows(case: ReadCase) -> bool:
    """llhttp keeps a trailing HTAB in Transfer-Encoding, so reads to the close; we read chunked."""
    return case.ref.end == PENDING and len(case.ours.replies) > case.at and bool(TE_TAB.search(case.data))


def trailer_fields(case: ReadCase) -> bool:
    """The reference refused a Content-Length among the trailers; we read and dropped them."""
    return case.ref_failed("Content-Length can't be", "bad Content-Length", "conflicting Content-Length")


_INTERIM = re.compile(rb"HTTP/1\.[01] 1[0-9][0-9] ")


def interim_close(case: ReadCase) -> bool:
    """llhttp took an interim answer (1xx) that says close as the connection's last; we skipped it."""
    return case.ref_failed("Data after `Connection: close`") and _INTERIM.search(case.data) is not None


def close_wins(case: ReadCase) -> bool:
    """We closed after an answer whose Connection says close (and keep-alive): llhttp keeps an
    HTTP/1.0 one that says both. RFC 9112 §9.3: close ends the connection."""
    if len(case.ours.replies) <= case.at or len(case.ref.replies) <= case.at:
        return False
    ours, ref = case.ours.replies[case.at], case.ref.replies[case.at]
    same = (ours.status, ours.body) == (ref.status, ref.body)
    return same and not ours.keep and ref.keep and bool(_CLOSE.search(case.data))


def _pending_agrees(ours: Read, ref: Read) -> bool:
    """llhttp's PENDING last answer (no end but the connection's) reads as either: read whole
    until the close, with the same body, or failed as cut short."""
    if ref.end != PENDING or ours.replies[: len(ref.replies) - 1] != ref.replies[:-1]:
        return False
    if ours.end == FAILED:
        return len(ours.replies) == len(ref.replies) - 1
    last, theirs = ours.replies[-1] if ours.replies else None, ref.replies[-1]
    same = last is not None and (last.status, last.body) == (theirs.status, theirs.body)
    return ours.end == DONE and len(ours.replies) == len(ref.replies) and same


def compare_reads(data: bytes, ours: Read, ref: Read, reference: str, rules: tuple[ReadRule, ...]) -> str | None:
    """As `compare`, for a client's reading of answers."""
    if (ours.replies, ours.end) == (ref.replies, ref.end) or _pending_agrees(ours, ref):
        return None
    at = 0
    while at < min(len(ours.replies), len(ref.replies)) and ours.replies[at] == ref.replies[at]:
        at += 1
    case = ReadCase(data, ours, ref, at)
    for name, against, _reason, holds in rules:
        if reference in against and holds(case):
            HITS[f"{reference}: {name}"] += 1
            return name
    raise Disagreement(
        f"the router and {reference} part at answer {at} of {data[:600]!r}\n  ours: {ours}\n  {reference}: {ref}"
    )


def same_framing(a: Served, b: Served) -> bool:
    """The same messages and ending: what any split of the bytes into reads must give. (Not
    always the same status: a head with two faults may be refused for the one seen first.)"""
    return (a.messages, a.end) == (b.messages, b.end)
