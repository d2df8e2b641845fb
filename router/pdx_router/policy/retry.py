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

    @property
    def kv(self) -> dict[str, Any] | None:
        """What prefill reads of decode's blocks; None: a fresh prefill."""
        return self.plan.kv if self.reuse else None

    @property
    def compared_ids(self) -> IdText | None:
        """The prompt ids this try's reuse was planned on, to hold decode's ids against."""
        return self.plan.compared_ids if self.reuse else None

    @property
    def reused_tokens(self) -> int:
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


@dataclass(frozen=True)
class Retry:
    attempt: Attempt  # the next try
    unreachable: bool  # the failed engine could not be reached: unhealthy until its next check


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
