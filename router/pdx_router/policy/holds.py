"""Claims on decode's held KV (`pdx_contract.holds`): what to claim, and what the answer means.

A decode whose engines run pdx's valve releases held turns under memory pressure, but never a
claimed one. So a turn that would read decode's blocks claims them first; a hold decode no
longer has makes the turn `released`: plain P/D at once, never a failed read. A hold decode
shortened (its tail freed) is read only up to the tokens decode says it kept. A decode
without the route (an engine without pdx's plugin) has no valve: it frees held KV only by a
read or its TTL, and reuse goes on as the router's deadline allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from enum import Enum
from typing import Any

from pydantic import ValidationError

from pdx_contract import kv_prefix
from pdx_contract.holds import RELEASED_KV, HoldsAnswer, ReleasedNote

from ..endpoints import Endpoint
from ..tokens import infer_block_size
from . import Outcome
from .retry import Attempt

PRESSED_S = 30.0  # a decode that gave up held KV this recently is under pressure (`pressed`)


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


def released_note(kv: dict[str, Any]) -> ReleasedNote | None:
    """Take decode's note of its latest early releases out of a turn's answer parameters (it is
    for the router, not for the next turn's prefill), if there is a valid one."""
    body = kv.pop(RELEASED_KV, None)
    if body is None:
        return None
    try:
        return ReleasedNote.model_validate(body)
    except ValidationError:
        return None


def parse(status: int, body: Any) -> HoldsAnswer | None:
    """Decode's answer to a holds call (HTTP status and JSON body), if it is one."""
    if status != 200:
        return None
    try:
        return HoldsAnswer.model_validate(body)
    except ValidationError:
        return None


def claimable(kv: dict[str, Any] | None, decode: Endpoint | None) -> str | None:
    """The hold a try reading `kv` would claim on `decode`: None without a hold to name, without
    its decode, or when that decode answers no claims (an engine without the valve is never asked)."""
    hold = hold_id(kv)
    return hold if decode is not None and decode.claims is not False else None


def would_claim(kv: dict[str, Any] | None, decode: Endpoint | None) -> bool:
    """Whether a try reading `kv` claims its hold on `decode` first (`Router._claim`): a hold it
    may claim, not already known released."""
    hold = claimable(kv, decode)
    return hold is not None and decode is not None and not known_released(decode, hold)


def pressed(decode: Endpoint, now: float) -> bool:
    """Whether `decode` gave up held KV under pressure in the last PRESSED_S (`Endpoint.pressed_at`,
    time.monotonic()). Then what the router last heard of a hold may be stale by the time a turn
    reaches decode, so a decode-local turn claims its hold first (`Router._claim_local`): the
    answer is current, and the claim keeps the hold until the turn has it. On the H200's
    overcommit point (`docs/results/h200-2026-12-06h-wave`) local turns on holds decode had just
    given up took 0.9-4.2 s where the others took 67 ms: decode computed their whole history again
    in its own batch (prompt throughput 10-13k tokens/s, its prefix-cache hit rate 91% -> 57%)."""
    return decode.pressed_at > 0 and now - decode.pressed_at < PRESSED_S


def known_released(decode: Endpoint, hold: str | None) -> bool:
    """Decode already said it released `hold` (an earlier answer's `released`): no claim needed."""
    return hold is not None and hold in decode.released


def blocks_given_up(decode: Endpoint, hold: str | None) -> bool:
    """Decode said it released `hold` and no younger hold covers its blocks: they went back to the
    pool, so its prefix cache may no longer have that history (a superseded hold's are still held)."""
    return hold is not None and decode.released.get(hold) is False


def tokens_given_up(decode: Endpoint, hold: str | None, held: int) -> int:
    """Of the `held` tokens a plan reads of `hold`, those decode said it gave up by shortening the
    hold under pressure (its prefix cache no longer has them); 0 when it kept them all."""
    kept = decode.kept.get(hold) if hold is not None else None
    return max(0, held - kept) if kept is not None else 0


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


def cut_to_kept(kv: dict[str, Any], tokens: int) -> dict[str, Any] | None:
    """A copy of a hold's parameters that names only its first `tokens` (decode kept those of a
    hold it shortened); None when they cannot be cut safely: then nothing may be read.

    Prefill's reader pairs the tail of `remote_block_ids` with its own blocks, so the list must
    end at the last kept block; a held prefix (`pdx_contract.kv_prefix`) is cut with it."""
    groups = kv.get("remote_block_ids")
    if not isinstance(groups, list) or len(groups) != 1 or not isinstance(groups[0], list):
        return None
    out = dict(kv)
    raw = kv.get(kv_prefix.HELD)
    if raw is not None:
        try:
            held = kv_prefix.HeldPrefix.model_validate(raw).cut(tokens)
        except ValidationError:
            held = None
        if held is None:
            return None
        out[kv_prefix.HELD] = held.to_json()
        blocks = -(-held.num_tokens // held.block_size)
    else:
        n = kv.get("remote_num_tokens")
        if not isinstance(n, int) or n <= 0:
            return None
        if tokens >= n:
            return out
        size = infer_block_size(n, len(groups[0]))
        if size is None or tokens < size:
            return None
        blocks = tokens // size
        out["remote_num_tokens"] = blocks * size
    out["remote_block_ids"] = [list(groups[0][:blocks])]
    return out


def after_claim(attempt: Attempt, claim: Claim, kept: int | None = None, expiry: float | None = None) -> Attempt:
    """The try to make once decode answered: reuse only what is pinned (or cannot be released),
    of a hold decode shortened (`kept` tokens left) only that prefix, and no later than the
    claim's lease (`expiry`, decode's clock: `cap_expiry`)."""
    if claim is Claim.HELD and attempt.plan.kv is not None and (kept is not None or expiry is not None):
        kv: dict[str, Any] | None = attempt.plan.kv
        if kept is not None:
            kv = cut_to_kept(attempt.plan.kv, kept)
        if kv is None:
            return replace(attempt, outcome=Outcome.RELEASED, reuse=False)
        if expiry is not None:
            kv = cap_expiry(kv, expiry)
        reused = attempt.plan.reused_tokens if kept is None else min(attempt.plan.reused_tokens, kept)
        return replace(attempt, plan=replace(attempt.plan, kv=kv, reused_tokens=reused))
    if claim in (Claim.HELD, Claim.NO_VALVE):
        return attempt
    if claim is Claim.UNREACHABLE:  # as a decode hop that cannot connect: another decode
        return replace(attempt, outcome=Outcome.EXPIRED, reuse=False, affinity=None)
    return replace(attempt, outcome=Outcome.RELEASED, reuse=False)


def cap_expiry(kv: dict[str, Any], expiry: float) -> dict[str, Any]:
    """A copy of a hold's parameters whose read must start before the claim's lease ends: vLLM's
    prefill declines a read within its safety margin of `remote_blocks_expiry_time`, and decode
    may release the hold once the lease is over (`pdx_contract.holds`)."""
    current = kv.get("remote_blocks_expiry_time")
    out = dict(kv)
    if not isinstance(current, (int, float)) or isinstance(current, bool) or expiry < current:
        out["remote_blocks_expiry_time"] = expiry
    return out


BODY_BYTES_PER_TOKEN = 4  # a completion request's JSON bytes per prompt token, roughly (English text)


def prefill_tokens(body_bytes: int, reused_tokens: int) -> int:
    """What prefill will compute of a turn, roughly: its body's size in tokens less what it
    reads from decode (the router need not have tokenized the prompt)."""
    return max(1, body_bytes // BODY_BYTES_PER_TOKEN - reused_tokens)


def may_claim(ahead_tokens: int, budget: int) -> bool:
    """A turn claims its hold only once its prefill has at most `budget` prompt tokens of the
    router's requests still to compute (`router.claimQueueTokens`): the claim then pins the hold
    about as long as that work takes, not for a whole queue's wait (claim_gate.py says why)."""
    return ahead_tokens <= budget
