"""Decode's held KV as the router claims it: ``POST /v1/pdx/holds`` on a decode engine.

Held KV is a cache, never a reservation: when a request would wait for blocks, decode's
engine plugin (`pdx_engine.held_kv`) releases held conversations (those that come back last first).
An early release must never let prefill read blocks that were freed and reused, and the guard
must not depend on a clock. So a hold is released only while unclaimed: before the router
attaches a hold to a prefill request it claims it here, and decode answers which of the holds
it still has (now pinned) and how much of each it shortened; after prefill has answered (read
done, or no read), the router drops the claim. A hold missing from the answer was released:
that turn goes without reuse. A shortened one is read only up to its kept tokens.
Each answer also names the holds released early since the router last asked (``since``), so the
next turn of a released conversation goes plain at once, without a claim. Decode's answer to
every turn it holds names its latest releases too (``RELEASED_KV``, a `ReleasedNote`), so the
router learns of a release at the next answer of any conversation on that decode.

A drop can be lost (the router restarted mid-turn, its call failed), and a lost drop would pin
the hold until the TTL (minutes) while new work waits. So a router that caps its reads
(``lease``) gets claims that pin for a lease only: it lowers the read's
``remote_blocks_expiry_time`` to the answer's ``claim_expiry``, and prefill's vLLM declines a
read that would start within its safety margin (5 s) of it. A claim past its lease therefore
has no read in flight, by the same clock guard vLLM's TTL rests on; decode may release it.

Typed here once: the engine plugin serves these, the router sends them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from pydantic import ConfigDict, Field

from .base import Document

PATH = "/v1/pdx/holds"

HoldId = str  # decode's request id: `remote_request_id` in decode's kv_transfer_params
MAX_IDS = 256  # ids per list in one request
# The kv_transfer_params of a decode-local turn (the router prefills it on the decode that holds
# its conversation): no read from anyone, and decode keeps the finished turn as after any decode
# hop. The engine plugin has NIXL's worker track such turns' holds (`pdx_engine.held_kv`).
LOCAL_TURN_KV: dict[str, bool] = {"do_remote_decode": False, "do_remote_prefill": False}
RELEASED_KV = "pdx_released"  # decode's final kv_transfer_params: its latest early releases (ReleasedNote)
NOTE_IDS = 16  # releases named in one ReleasedNote
CLAIM_LEASE_S = 30.0  # how long a leased claim pins its hold unless decode is told otherwise


class HoldsRequest(Document):
    """Claims to take and claims to drop, by hold id; either may be empty."""

    claim: list[HoldId] = Field(default_factory=list, max_length=MAX_IDS)
    release_claim: list[HoldId] = Field(default_factory=list, max_length=MAX_IDS)
    since: int = Field(default=0, ge=0)
    """The last `HoldsAnswer.seq` this caller saw: the answer names the releases after it."""
    release_unclaimed: bool = False
    """Release every hold nobody has claimed, now (after this request's own claims and drops):
    a benchmark starts each point from an empty decode, not from the last point's holds. Not
    counted as pressure; the answer's ``released`` names them, so routers stop attaching them."""
    lease: bool = False
    """The caller caps every read of the holds it claims here at the answer's `claim_expiry`
    (prefill's `remote_blocks_expiry_time`: vLLM declines a read that would start within its
    safety margin of it). Decode may then release such a claimed hold once the lease is over, so
    a claim whose drop never comes (a router restarted or partitioned mid-turn) pins nothing for
    long. A caller that does not cap reads leaves this false: its claims pin until dropped."""


class _Answer(Document):
    """What decode writes for routers: unknown fields are ignored, so a newer decode's extra
    figures do not turn an older router's claims into failures during an upgrade (as
    `pdx_contract.stats` is read by an older operator). What routers send stays strict."""

    model_config = ConfigDict(extra="ignore")


class HoldsAnswer(_Answer):
    """Which claimed holds decode still has (each now claimed once more), and its KV figures."""

    held: list[HoldId] = Field(default_factory=list)
    kept: dict[HoldId, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    """Of the held ones, those shortened under pressure: the leading tokens still held. Prefill
    may read only those; the blocks past them were freed and may hold another request's KV."""
    held_blocks: int = Field(default=0, ge=0)
    """Blocks of finished turns decode keeps for their next turn."""
    capacity_blocks: int = Field(default=0, ge=0)
    releases: int = Field(default=0, ge=0)
    """Holds released early since the engine started (pressure, not the TTL nor a read)."""
    trims: int = Field(default=0, ge=0)
    """Holds shortened early since the engine started (their tails freed, their prefixes kept)."""
    waited: int = Field(default=0, ge=0)
    """Requests refused KV blocks at least once while decode kept held KV (the valve off, or every
    hold claimed): what held KV cost new work, since the engine started."""
    released: list[HoldId] = Field(default_factory=list)
    """Holds released early (under pressure, or superseded: a younger hold of the same tokens
    covers them) after the request's ``since`` (the last MAX_IDS at most; all that
    are kept when ``since`` is ahead of ``seq``: the engine restarted)."""
    covered: list[HoldId] = Field(default_factory=list)
    """Of `released`, those superseded: a younger hold covers their blocks, so decode still has
    them (its prefix cache serves that history). The others' blocks went back to the pool."""
    seq: int = Field(default=0, ge=0)
    """Early releases of either kind since the engine started: the caller's next ``since``."""
    claim_expiry: float | None = None
    """For a `lease` request that pinned anything: when those claims stop pinning, on decode's
    clock (that of vLLM's `remote_blocks_expiry_time`)."""
    claimed: int = Field(default=0, ge=0)
    """Holds pinned by a claim now, after this request's claims and drops."""
    lapsed: int = Field(default=0, ge=0)
    """Holds released under pressure after their claims' lease ran out, since the engine started:
    claims whose drop never came."""
    valve: bool = True
    """False when the plugin could not patch this vLLM: holds are then freed only by a read or
    the TTL, as without pdx, and claims always succeed while the TTL runs."""


class ReleasedNote(_Answer):
    """Decode's latest early releases, in its answer to every turn it holds. A released
    conversation's next turn comes seconds later (the user's or the tool's time), and other
    conversations' answers come in between: by then the router knows, and the turn goes plain
    without a claim, whose answer waits for decode's engine step (the cost ON paid over OFF at
    4x overcommit on CPU, where nearly every hold was released)."""

    since: int = Field(ge=0)
    """The release number before the first of `released`: the note is all there is after it."""
    seq: int = Field(ge=0)
    """The last release's number (`HoldsAnswer.seq`)."""
    released: list[HoldId] = Field(default_factory=list, max_length=NOTE_IDS)
    covered: list[HoldId] = Field(default_factory=list, max_length=NOTE_IDS)
    """Of `released`, those a younger hold covers (`HoldsAnswer.covered`)."""
    kept: dict[HoldId, Annotated[int, Field(ge=0)]] = Field(default_factory=dict, max_length=NOTE_IDS)
    """The holds decode shortened most recently and still keeps: the leading tokens of each it
    still holds (`HoldsAnswer.kept`). Its prefix cache no longer has the rest, so a turn prefilled
    on decode would compute that too; the router counts it (`policy.local`)."""

    @classmethod
    def latest(
        cls,
        seq: int,
        released_after: Callable[[int], list[HoldId]],
        covered: Callable[[list[HoldId]], list[HoldId]] | None = None,
        kept: dict[HoldId, int] | None = None,
    ) -> ReleasedNote:
        """The note of the last NOTE_IDS releases up to `seq`, `released_after(n)` naming those after n
        and `covered(ids)` those of them a younger hold covers; `kept`: the latest shortened holds."""
        since = max(0, seq - NOTE_IDS)
        released = released_after(since)
        covers = covered(released) if covered else []
        return cls(since=since, seq=seq, released=released, covered=covers, kept=kept or {})
