"""Whether a failed hop is retried, and with what outcome.

A turn is tried at most twice. Reuse failing is never the client's problem: the retry is plain
P/D. An engine that cannot be reached is taken out of rotation and the turn goes to another.
A 5xx the engine answered to the request itself (no reuse involved) reaches the client as 502.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from ..ids import IdText
from . import Outcome
from .reuse import TurnPlan, checked_outcome


class Hop(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True)
class Attempt:
    """One try at a turn's two hops, and the outcome it reports if it gets through."""

    plan: TurnPlan
    outcome: Outcome
    reuse: bool  # prefill reads decode's blocks on this try
    affinity: str | None  # the decode to prefer: the one that held the entry
    retried: bool = False  # the turn's second and last try
    tokens: int | None = None  # what prefill reported reading, when the engines check the prefix
    local: bool = False  # prefilled on the decode that holds the conversation, no prefill hop

    @property
    def kv(self) -> dict[str, Any] | None:
        """What prefill reads of decode's blocks; None: a fresh prefill."""
        return self.plan.kv if self.reuse else None

    @property
    def compared_ids(self) -> IdText | None:
        """The prompt ids this try's reuse was planned on, to hold decode's ids against."""
        return self.plan.compared_ids if self.reuse or self.local else None

    @property
    def reused_tokens(self) -> int:
        """Tokens read from decode; on a local try, those its prefix cache held (at most)."""
        if self.local:
            return self.plan.reused_tokens
        if not self.reuse:
            return 0
        return self.plan.reused_tokens if self.tokens is None else self.tokens


def after_prefill(attempt: Attempt, prefill_kv: dict[str, Any] | None) -> Attempt:
    """A try whose prefill checked the prefix itself takes prefill's word for what it read."""
    if not (attempt.reuse and attempt.plan.checked_by_engines):
        return attempt
    outcome, tokens = checked_outcome(prefill_kv)
    return replace(attempt, outcome=outcome, reuse=outcome is Outcome.HIT, tokens=tokens)


def first_attempt(plan: TurnPlan) -> Attempt:
    return Attempt(plan, plan.outcome, plan.outcome is Outcome.HIT, plan.affinity)


def local_attempt(plan: TurnPlan) -> Attempt:
    """The turn sent whole to the decode that holds it (`local.decide` said so)."""
    return Attempt(plan, Outcome.LOCAL, False, plan.affinity, local=True)


@dataclass(frozen=True)
class Retry:
    attempt: Attempt  # the next try
    unreachable: bool  # the failed engine could not be reached: unhealthy until its next check


def after_local_failure(attempt: Attempt, status: int | None) -> Retry:
    """A local turn whose decode failed (unreachable, 5xx, a malformed answer) before its answer
    began goes through prefill, once: reading decode's blocks as planned if decode answered,
    else without reuse on another decode (the KV went with it). That try is a first try of the
    D->P path, with its own retry. (A 4xx is the client's: it is passed on, never retried.)"""
    if status is None:
        return Retry(Attempt(attempt.plan, Outcome.EXPIRED, False, None, retried=True), True)
    return Retry(first_attempt(attempt.plan), False)


def after_failure(attempt: Attempt, hop: Hop, status: int | None) -> Retry | None:
    """The retry of a failed hop (`status` None: no answer), or None to pass the failure on.

    - prefill failing with reuse (a declined or failed read of decode's blocks): `declined`;
    - prefill unreachable without reuse: the same outcome, on another prefill;
    - decode unreachable: another decode, and a reused turn is `expired` (its KV went too);
    - decode answering 5xx, or any failure of the retry: passed on.
    """
    unreachable = status is None
    if attempt.retried:
        return None
    if hop is Hop.PREFILL:
        if not (attempt.reuse or unreachable):
            return None
        outcome = Outcome.DECLINED if attempt.reuse else attempt.outcome
        return Retry(Attempt(attempt.plan, outcome, False, attempt.affinity, retried=True), unreachable)
    if not unreachable:
        return None
    outcome = Outcome.EXPIRED if attempt.reuse else attempt.outcome
    return Retry(Attempt(attempt.plan, outcome, False, None, retried=True), unreachable)
