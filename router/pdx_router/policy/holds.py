"""Claims on decode's held KV (`pdx_contract.holds`): what to claim, and what the answer means.

A decode whose engines run pdx's valve releases held turns under memory pressure, but never a
claimed one. So a turn that would read decode's blocks claims them first; a hold decode no
longer has makes the turn `released`: plain P/D at once, never a failed read. A decode
without the route (an engine without pdx's plugin) has no valve: it frees held KV only by a
read or its TTL, and reuse goes on as the router's deadline allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from enum import Enum
from typing import Any

from pydantic import ValidationError

from pdx_contract.holds import HoldsAnswer

from ..endpoints import Endpoint
from . import Outcome
from .retry import Attempt


class Claim(Enum):
    """Decode's answer to a claim, as the turn reads it."""

    HELD = "held"  # pinned until the router drops the claim
    GONE = "gone"  # released under pressure (or read, or expired): nothing to read
    NO_VALVE = "no_valve"  # the engine answers no claims (no route): it never releases early
    FAILED = "failed"  # an answer other than the route's: decode may release it at any time, so it is not read
    UNREACHABLE = "unreachable"  # no answer at all: decode is gone, and the KV with it


def hold_id(kv: dict[str, Any] | None) -> str | None:
    """The hold a prefill request would read: decode's request id in the parameters it returned."""
    if not kv or not kv.get("do_remote_decode"):
        return None
    rid = kv.get("remote_request_id")
    return rid if isinstance(rid, str) and rid else None


def holder(endpoints: Sequence[Endpoint], url: str | None) -> Endpoint | None:
    """The decode that holds the conversation's KV (draining or not: its KV is still read)."""
    return next((e for e in endpoints if e.role == "decode" and e.url == url), None)


def parse(status: int, body: Any) -> HoldsAnswer | None:
    """Decode's answer to a holds call (HTTP status and JSON body), if it is one."""
    if status != 200:
        return None
    try:
        return HoldsAnswer.model_validate(body)
    except ValidationError:
        return None


def known_released(decode: Endpoint, hold: str) -> bool:
    """Decode already said it released `hold` (an earlier answer's `released`): no claim needed."""
    return hold in decode.released


def read_answer(hold: str, status: int, body: Any) -> Claim:
    """Decode's answer (HTTP status, 0 for none, and JSON body) to a claim on `hold`."""
    return read(hold, status, parse(status, body))


def read(hold: str, status: int, answer: HoldsAnswer | None) -> Claim:
    """Decode's answer to a claim on `hold`: the HTTP status (0 for none) and what `parse` made
    of the body.

    A decode without the route (404, 405) runs no valve. One whose plugin could not patch its
    scheduler says `valve: false`: it grants no claim, and releases nothing early either."""
    if status == 0:
        return Claim.UNREACHABLE
    if status in (404, 405):
        return Claim.NO_VALVE
    if answer is None:
        return Claim.FAILED
    if hold in answer.held:
        return Claim.HELD
    return Claim.GONE if answer.valve else Claim.NO_VALVE


def after_claim(attempt: Attempt, claim: Claim) -> Attempt:
    """The try to make once decode answered: reuse only what is pinned (or cannot be released)."""
    if claim in (Claim.HELD, Claim.NO_VALVE):
        return attempt
    if claim is Claim.UNREACHABLE:  # as a decode hop that cannot connect: another decode
        return replace(attempt, outcome=Outcome.EXPIRED, reuse=False, affinity=None)
    return replace(attempt, outcome=Outcome.RELEASED, reuse=False)
