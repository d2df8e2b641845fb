"""vLLM general plugin: decode's held KV is a cache that yields to work, never a reservation.

With bidirectional transfer vLLM pins a finished turn's blocks on decode until prefill reads
them or ``decoder_kv_blocks_ttl`` runs out; when agents' held conversations fill the cache,
new requests wait for the TTL (minutes). With this plugin, whenever the scheduler cannot
allocate blocks for a request (admission, a P->D read's landing, a local turn, a running
request's growth), it first releases held turns until the request fits, those whose
conversations come back last first (`Holds.victim`); only then does vLLM wait or preempt as
before. A hold goes whole (the default), or with ``PDX_HELD_KV_SHORTEN=1`` gives up only what
the request lacks, from its tail (`shorten`): the rest stays readable, and prefill reads that
prefix and computes the remainder (`shorten_from_env` says why whole is the default).

Safety does not rest on a clock: a hold is released only while no router claims it
(`pdx_contract.holds`). The router claims a hold before attaching it to a prefill request and
drops the claim once prefill has answered, so no read is in flight on a hold that is released.
A claim whose router caps the read at the claim's expiry (``lease``) pins for
``PDX_HELD_KV_CLAIM_LEASE`` seconds at most (30 unless set; at least 10), so a drop that never
comes (a router restarted mid-turn) costs a lease, not the TTL.
A release frees the blocks in the scheduler at once and tells the worker (NIXL's own send
deadline, set to the past) to forget them; the worker's later "sent" report is swallowed. A hold
shortened while unclaimed reports its kept tokens in the next claim's answer, and the router
cuts what prefill reads to them; blocks past them are never named to a reader again. Every held
turn's answer also names the latest shortened holds (`contract.ReleasedNote.kept`), so the router
counts a lost tail before it prefills a turn on decode.

``PDX_HELD_KV_VALVE=0`` turns the valve off (claims are still answered); anything else, or
unset, leaves it on. ``PDX_HELD_KV_MAX_FRACTION`` (0 < f <= 1, from the CR's
``kvTransfer.heldKvMaxFraction``) keeps 1 - f of the cache free of held KV: a turn that ends with
less free releases holds at once, so new work finds that room without a release on its path. A vLLM
whose scheduler lacks what is patched here says so at start and answers claims with
``valve: false``.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any

from pdx_contract import holds as contract
from pdx_engine import holds_route
from pdx_engine.plugin_env import switch

logger = logging.getLogger("vllm.pdx_plugin")

ENV = "PDX_HELD_KV_VALVE"
FRACTION_ENV = "PDX_HELD_KV_MAX_FRACTION"
SHORTEN_ENV = "PDX_HELD_KV_SHORTEN"
LEASE_ENV = "PDX_HELD_KV_CLAIM_LEASE"
CLAIM_LEASE_S = contract.CLAIM_LEASE_S  # reads start within seconds of their claim
MIN_LEASE_S = 10.0  # vLLM's prefill declines reads within 5 s of the expiry: a shorter lease leaves no read
SCHEDULER = "vllm.v1.core.sched.scheduler"
ENGINE_CORE = "vllm.v1.engine.core"
CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector"
_MARK = "_pdx_held_kv"
WAITED_KEPT = 4096  # request ids remembered so a request refused over many steps counts once
GAPS_KEPT = 64  # the last gaps between turns measured (their median decides what goes first)
MIN_GAPS = 4  # fewer say nothing: no hold is taken for stale until then
# Shortening bets that a hold's prefix will be read: a shortened hold later claimed (or whose
# conversation came back on decode) won; one released under pressure lost. Over the last BETS_KEPT
# settled within BETS_WINDOW_S, at least MIN_BETS, winning under MIN_PAYOFF of them turns shortening
# off until the losses age out: at 3.9x overcommit on CPU no shortened hold was read, and trimming
# cost TTFT against whole releases (docs/results/cpu-2026-12-07-shortened-default).
BETS_KEPT = 16
MIN_BETS = 8
MIN_PAYOFF = 0.25
BETS_WINDOW_S = 60.0
STALE_GAPS = 2.0  # a hold idle this many typical gaps belongs to a conversation that has likely ended


def valve_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether early release is on (the default)."""
    return switch(ENV, True, "1 (release held KV under pressure) or 0", environ)


def shorten_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether a hold gives up only its tail under pressure, or all of it (the default).

    On the CPU overcommit study shortened holds reused more at 2x (51-53% of the follow-ups
    against whole holds' 32-40%, six runs pooled twice, docs/results/cpu-2026-12-07-*) with no
    request waiting on held KV, but whole holds had the lower tails (p99 0.69x OFF's at 2x and
    0.84x at 4x, against 0.85x and 0.96x). On the GPU, where it matters, whole holds won at the
    overcommit point: one H100 run side by side (docs/results/h100-2026-12-07-wave), p50 342 ms
    against 2,858, p99 4,516 against 6,880 (OFF 7,131), no request waiting against 3: shortened
    holds were released anyway (33 releases and 41 trims against 22 releases), and 18 follow-ups
    recomputed against 15. Where shortened holds go unread, decode stops shortening for a while
    (`Holds.shortening`)."""
    return switch(SHORTEN_ENV, False, "1 (give up a hold's tail) or 0 (whole holds)", environ)


def _number(raw: str) -> float:
    """``raw`` as a float; NaN (which fails every range check) when it is not a number."""
    try:
        return float(raw)
    except ValueError:
        return float("nan")


def lease_from_env(environ: Mapping[str, str] = os.environ) -> float:
    """How long a leased claim pins its hold, in seconds."""
    raw = environ.get(LEASE_ENV, "").strip()
    if not raw:
        return CLAIM_LEASE_S
    lease = _number(raw)
    if not lease >= MIN_LEASE_S:
        raise ValueError(
            f"{LEASE_ENV}={raw!r}: expected seconds, at least {MIN_LEASE_S:g} (prefill declines a read within 5 s"
            f" of the claim's expiry), or unset it for {CLAIM_LEASE_S:g}"
        )
    return lease


def max_fraction_from_env(environ: Mapping[str, str] = os.environ) -> float | None:
    """Held KV's largest share of the cache, or None (no cap)."""
    raw = environ.get(FRACTION_ENV, "").strip()
    if not raw:
        return None
    value = _number(raw)
    if not 0 < value <= 1:
        raise ValueError(
            f"{FRACTION_ENV}={raw!r}: expected a share of decode's KV cache in (0, 1], e.g. 0.5, or unset it"
        )
    return value


class Holds:
    """Decode's finished turns whose blocks are kept for prefill, and which one to release first.

    Pure bookkeeping: the scheduler patch below calls it, tests drive it directly (`clock`).
    """

    def __init__(
        self,
        valve: bool = True,
        clock: Callable[[], float] = time.monotonic,
        shorten: bool = False,
        lease: float = CLAIM_LEASE_S,
    ) -> None:
        self.valve = valve
        self.shorten = shorten  # give up a hold's tail only; False: whole holds
        self.clock = clock
        self.lease = lease  # seconds a leased claim pins (`pdx_contract.holds`)
        self._held: OrderedDict[str, int] = OrderedDict()  # hold id -> claims, least recently used first
        self._pinned_until: dict[str, float] = {}  # claimed holds -> when their claims lapse (inf: never)
        self._claimed_at: dict[str, float] = {}  # claimed holds -> when their first live claim came
        self._born: dict[str, float] = {}  # hold id -> when its turn ended
        self._gaps: deque[float] = deque(maxlen=GAPS_KEPT)  # turn end -> the next turn's claim, seconds
        self._released: set[str] = set()  # freed early; the worker's "sent" report is still due
        self._kept: dict[str, int] = {}  # shortened holds: the leading tokens still held
        self._trimmed: deque[str] = deque(maxlen=contract.NOTE_IDS)  # the latest shortened, for the note
        self._open_bets: set[str] = set()  # shortened holds whose prefix is not yet read nor released
        self._bets: deque[tuple[float, bool]] = deque(maxlen=BETS_KEPT)  # (when, read) per settled bet
        self.trims = 0  # holds shortened under pressure (their tails freed, their prefixes kept)
        self.releases = 0  # released under pressure
        self.superseded = 0  # released because a younger hold covers them (`supersede`)
        self.seq = 0  # early releases of either kind: the number of the last (`released_after`)
        self._release_log: deque[tuple[int, str]] = deque(maxlen=contract.MAX_IDS)
        self._covered: set[str] = set()  # of the logged releases, those a younger hold covers
        self._waited: OrderedDict[str, None] = OrderedDict()  # the last WAITED_KEPT ids counted below
        self.waited = 0  # requests refused blocks at least once while decode kept held KV
        self.lapsed = 0  # released under pressure with a claim whose lease had run out

    def __contains__(self, hold: str) -> bool:
        return hold in self._held

    def ids(self) -> list[str]:
        return list(self._held)

    def add(self, hold: str) -> None:
        self._held[hold] = 0
        self._held.move_to_end(hold)
        self._born[hold] = self.clock()

    def claim(self, ids: list[str], leased: bool = False) -> list[str]:
        """Pin each id still held; the pinned ones, which also count as just used. A hold's first
        claim measures its conversation's gap between turns. A leased claim pins for `lease`
        seconds at most; any other until it is dropped."""
        out = []
        now = self.clock()
        until = now + self.lease if leased else float("inf")
        for hold in ids:
            if hold in self._held:
                born = self._born.pop(hold, None)
                if born is not None:
                    self._gaps.append(now - born)
                self._held[hold] += 1
                self._held.move_to_end(hold)
                self._pinned_until[hold] = max(self._pinned_until.get(hold, until), until)
                self._claimed_at.setdefault(hold, now)
                self._settle(hold, read=True)
                out.append(hold)
        return out

    def _settle(self, hold: str, read: bool) -> None:
        if hold in self._open_bets:
            self._open_bets.discard(hold)
            self._bets.append((self.clock(), read))

    def shortening(self) -> bool:
        """Whether to give up a hold's tail (not all of it) now: shortening is on, and its recent
        bets won often enough (`MIN_PAYOFF`), or too few are recent to say."""
        if not self.shorten:
            return False
        recent = self.clock() - BETS_WINDOW_S
        reads = [read for when, read in self._bets if when >= recent]
        return len(reads) < MIN_BETS or sum(reads) >= MIN_PAYOFF * len(reads)

    def _pinned(self, hold: str, claims: int, now: float) -> bool:
        return claims > 0 and now < self._pinned_until.get(hold, float("inf"))

    def unclaimed(self) -> list[str]:
        """The holds no claim pins now (none taken, or every one past its lease), youngest last."""
        now = self.clock()
        return [hold for hold, claims in self._held.items() if not self._pinned(hold, claims, now)]

    def claim_ages(self) -> list[float]:
        """Seconds since each hold a claim pins now was first claimed, longest first: how long the
        reads that hold them have been coming (the claim gate's wait and prefill's queue, then the read)."""
        now = self.clock()
        pinned = [h for h, claims in self._held.items() if self._pinned(h, claims, now)]
        return sorted((now - self._claimed_at[h] for h in pinned if h in self._claimed_at), reverse=True)

    def claimed(self) -> int:
        """Holds a claim pins now."""
        now = self.clock()
        return sum(self._pinned(hold, claims, now) for hold, claims in self._held.items())

    def came_back(self, hold: str) -> None:
        """``hold``'s conversation came back without a claim (its next turn ran on decode from
        its prefix cache, `supersede`): that measures its gap between turns, as a claim does."""
        born = self._born.pop(hold, None)
        if born is not None:
            self._gaps.append(self.clock() - born)
        self._settle(hold, read=True)

    def release_claim(self, ids: list[str]) -> None:
        for hold in ids:
            if self._held.get(hold, 0) > 0:
                self._held[hold] -= 1
                if self._held[hold] == 0:
                    self._pinned_until.pop(hold, None)
                    self._claimed_at.pop(hold, None)

    def refused(self, request_id: str) -> bool:
        """A request found no room: counted once if held KV was there to blame (the valve off,
        or every hold claimed). True when counted now."""
        if not self._held or request_id in self._waited:
            return False
        self._waited[request_id] = None
        if len(self._waited) > WAITED_KEPT:
            self._waited.popitem(last=False)
        self.waited += 1
        return True

    def typical_gap(self) -> float | None:
        """The median gap between a turn's end and its conversation's next claim, once measured."""
        if len(self._gaps) < MIN_GAPS:
            return None
        return sorted(self._gaps)[len(self._gaps) // 2]

    def victim(self) -> str | None:
        """The unclaimed hold to release first; None when the valve is off or none is free.

        The one whose conversation comes back last (Belady's choice, with every conversation
        expected back one typical gap after its turn ended): a hold idle for STALE_GAPS typical
        gaps (its conversation has likely ended) before any other, the oldest first; else the
        youngest, whose conversation waits out the longest think time before its next turn.
        Least recently used thrashes under agents whose turns come round in a cycle: it
        releases exactly the hold whose turn is next (0 of 12 turns reused at 2x overcommit,
        docs/results/cpu-2026-12-05-overcommit-lru). It is not the fallback before gaps are
        measured either: gaps are measured by reads, which LRU never lets happen.
        """
        if not self.valve:
            return None
        free = self.unclaimed()
        if not free:
            return None
        gap = self.typical_gap()
        if gap is not None:
            now = self.clock()
            stale = next((h for h in free if h in self._born and now - self._born[h] > STALE_GAPS * gap), None)
            if stale is not None:
                return stale
        return free[-1]

    def _forget(self, hold: str) -> None:
        self._held.pop(hold, None)
        self._pinned_until.pop(hold, None)
        self._claimed_at.pop(hold, None)
        self._born.pop(hold, None)
        self._kept.pop(hold, None)
        self._open_bets.discard(hold)

    def shortened(self, hold: str, tokens: int) -> None:
        """``hold``'s tail was freed early: only its first ``tokens`` may be read from now on."""
        self._kept[hold] = tokens
        self._open_bets.add(hold)
        self.trims += 1
        if hold in self._trimmed:
            self._trimmed.remove(hold)
        self._trimmed.append(hold)

    def kept(self, ids: list[str]) -> dict[str, int]:
        """The tokens still held of each of ``ids`` that was shortened."""
        return {hold: self._kept[hold] for hold in ids if hold in self._kept}

    def latest_kept(self) -> dict[str, int]:
        """The latest shortened holds still held (at most NOTE_IDS), and their kept tokens."""
        return self.kept(list(self._trimmed))

    def released(self, hold: str, pressure: bool = True, covered: bool = False) -> None:
        """``hold`` was freed early (under pressure, superseded, or asked): forget it, and expect the
        worker to report it once more. ``covered``: a younger hold keeps its blocks (`supersede`)."""
        if self._held.get(hold, 0) > 0:
            self.lapsed += 1  # only a claim past its lease lets a claimed hold go
        if pressure:
            self._settle(hold, read=False)
        self._forget(hold)
        self._released.add(hold)
        if pressure:
            self.releases += 1
        else:
            self.superseded += 1
        self.seq += 1
        if len(self._release_log) == self._release_log.maxlen:
            self._covered.discard(self._release_log[0][1])
        self._release_log.append((self.seq, hold))
        if covered:
            self._covered.add(hold)

    def covered(self, ids: list[str]) -> list[str]:
        """Of ``ids`` (released early), those a younger hold covers: their blocks are still held."""
        return [hold for hold in ids if hold in self._covered]

    def released_after(self, since: int) -> list[str]:
        """Holds released early after release number ``since`` (the last MAX_IDS); every kept one
        when ``since`` is ahead (the caller saw an engine that has since restarted)."""
        if since > self.seq:
            since = 0
        newest: list[str] = []  # read from the end: every held turn's answer asks for the last few
        for seq, hold in reversed(self._release_log):
            if seq <= since:
                break
            newest.append(hold)
        return newest[::-1]

    def finished(self, sent: set[str]) -> set[str]:
        """The worker's "sent" report (read by prefill, or past the TTL), less what was released
        early and so already freed; those holds are forgotten."""
        for hold in sent:
            self._forget(hold)
        stale = sent & self._released
        self._released -= stale
        return sent - stale if stale else sent

    def gone(self, hold: str) -> None:
        """The scheduler no longer has ``hold`` (freed by vLLM itself)."""
        self._forget(hold)


def held_blocks(scheduler: Any, holds: Holds) -> int:
    """The KV blocks decode keeps for held turns, each counted once: a conversation's turns held
    one after another (decode-local turns) and conversations of one system prompt share their
    leading blocks through vLLM's prefix cache."""
    manager = scheduler.kv_cache_manager
    seen: set[int] = set()
    for hold in holds.ids():
        try:
            seen.update(manager.get_block_ids(hold)[0])
        except (KeyError, IndexError):
            continue
    return len(seen)


def release(scheduler: Any, holds: Holds, hold: str, pressure: bool = True, covered: bool = False) -> bool:
    """Free ``hold``'s blocks now and have the worker drop its send deadline; False if unknown.
    ``covered``: a younger hold keeps the same blocks (`supersede`), so only this hold's claim on
    them goes."""
    request = scheduler.requests.get(hold)
    if request is None or not request.is_finished():
        holds.gone(hold)
        return False
    scheduler._free_blocks(request)
    sender = getattr(getattr(scheduler, "connector", None), "connector_scheduler", None)
    pending = getattr(sender, "_reqs_need_send", None)
    if isinstance(pending, dict):
        pending[hold] = float("-inf")  # the worker reaps it at its next step, then reports it sent
    holds.released(hold, pressure, covered)
    logger.debug("pdx plugin: released held KV of %s (%s)", hold, "under pressure" if pressure else "superseded")
    return True


def _group(scheduler: Any) -> Any | None:
    """The manager of the one KV cache group; None for hybrid models, whose groups would have
    to be cut alike (their holds are released whole)."""
    coordinator = getattr(scheduler.kv_cache_manager, "coordinator", None)
    managers: tuple[Any, ...] = tuple(getattr(coordinator, "single_type_managers", ()))
    return managers[0] if len(managers) == 1 else None


def _block_size(scheduler: Any) -> int:
    return int(getattr(_group(scheduler), "block_size", 0) or 0)


def _blocks_of(scheduler: Any, hold: str) -> tuple[Any, list[Any]] | None:
    """The one KV cache group's manager and ``hold``'s blocks in it (`_group`)."""
    manager = _group(scheduler)
    blocks = manager.req_to_blocks.get(hold) if manager is not None else None
    return (manager, blocks) if isinstance(blocks, list) else None


def shorten(scheduler: Any, holds: Holds, hold: str, blocks: int, min_keep: int) -> None:
    """Free the last ``blocks`` of ``hold``'s blocks, or all of them when fewer than ``min_keep``
    would be left (a prefix too short to be worth a read).

    vLLM frees a request's blocks from its manager's list (``req_to_blocks``): the tail cut here
    goes back to the pool now (tail first, as vLLM frees), and a later read or TTL frees the rest.
    """
    request = scheduler.requests.get(hold)
    whole = not holds.shortening() or request is None or not request.is_finished()
    found = None if whole else _blocks_of(scheduler, hold)
    if found is None or len(found[1]) - blocks < max(min_keep, 1):
        release(scheduler, holds, hold)
        return
    manager, owned = found
    keep = len(owned) - blocks
    tail = owned[keep:]
    del owned[keep:]
    if manager.num_cached_block.get(hold, 0) > keep:
        manager.num_cached_block[hold] = keep
    manager.block_pool.free_blocks(reversed(tail))
    holds.shortened(hold, keep * int(manager.block_size))
    logger.debug("pdx plugin: shortened held KV of %s to %d blocks under pressure", hold, keep)


def _covers(scheduler: Any, new: str, old: str) -> bool:
    """Whether hold ``new`` holds every token ``old`` does, in the same blocks: ``old``'s whole
    blocks are ``new``'s first ones (vLLM's prefix cache shares them) and the tokens of its last,
    partial block begin ``new``'s at that place."""
    group = _group(scheduler)
    new_req, old_req = scheduler.requests.get(new), scheduler.requests.get(old)
    if group is None or new_req is None or old_req is None:
        return False
    size = int(group.block_size)
    mine, theirs = group.req_to_blocks.get(new), group.req_to_blocks.get(old)
    if not mine or not theirs or size <= 0:
        return False
    old_ids, new_ids = old_req.all_token_ids, new_req.all_token_ids
    whole = len(old_ids) // size
    if not old_ids or len(old_ids) > len(new_ids) or whole > min(len(theirs), len(mine)):
        return False
    # Checked for every unclaimed hold as each held turn ends (the scheduler's thread): the last
    # whole block tells other conversations apart at once (a shared system prompt's blocks do not).
    if whole and theirs[whole - 1] != mine[whole - 1]:
        return False
    if list(theirs[:whole]) != list(mine[:whole]):
        return False
    return list(old_ids[whole * size :]) == list(new_ids[whole * size : len(old_ids)])


def supersede(scheduler: Any, holds: Holds, hold: str) -> None:
    """Release the unclaimed holds that the new ``hold`` covers (`_covers`): a conversation's
    earlier turn whose next turn ran on decode from its prefix cache (a decode-local turn, or a
    recompute that landed there). The router reads only the newer; the older would keep its
    blocks pinned twice over, and as the older hold it would outlive the newer under pressure.
    Its conversation came back: the gap is measured, so that without claims (decode-local turns
    make none) the valve still tells ended conversations from live ones (`Holds.victim`)."""
    for other in holds.unclaimed():
        if other != hold and _covers(scheduler, hold, other):
            holds.came_back(other)
            release(scheduler, holds, other, pressure=False, covered=True)


def let_covered_go(scheduler: Any, holds: Holds, dropped: list[str]) -> None:
    """Holds whose claims were just dropped and that a younger hold covers go now, as superseded
    (`supersede` passed them over while claimed): a decode-local turn on a pressed decode claims
    the hold its turn extends (`pdx_router.policy.holds.pressed`), and by the time the drop comes
    the turn's own hold covers it. Kept, such a hold would pin nothing of its own, yet count as
    held KV and be picked as a victim that frees nothing."""
    free = set(holds.unclaimed())
    for old in dropped:
        if old in free and any(new != old and _covers(scheduler, new, old) for new in holds.ids()):
            holds.came_back(old)
            release(scheduler, holds, old, pressure=False, covered=True)


def _shortfall(scheduler: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """A first guess at the blocks a refused ``allocate_slots(request, num_new_tokens, ...)``
    lacks: the new tokens' blocks beyond the free ones (the valve doubles it if short)."""
    tokens = kwargs.get("num_new_tokens", args[0] if args else 0)
    size = _block_size(scheduler)
    if not isinstance(tokens, int) or size <= 0:
        return 1
    free = int(scheduler.kv_cache_manager.block_pool.get_num_free_blocks())
    return max(1, -(-tokens // size) - free)


def _log_wait(scheduler: Any, holds: Holds, request_id: str) -> None:
    """Say once why a request waits with held KV present, so a wait in a benchmark's count can be
    told apart in decode's log: the valve off, or every hold claimed (reads in flight, local turns
    pinned), with the free and the held blocks then."""
    pool = scheduler.kv_cache_manager.block_pool
    ages = ", ".join(f"{age:.2f}" for age in holds.claim_ages())
    why = "the valve is off" if not holds.valve else f"all {holds.claimed()} holds are claimed, for {ages} s"
    logger.info(
        "pdx plugin: request %s waits for blocks with held KV present (%s): %d blocks free, %d held",
        request_id,
        why,
        int(pool.get_num_free_blocks()),
        held_blocks(scheduler, holds),
    )


def wrap_allocate(scheduler: Any, holds: Holds, allocate: Callable[..., Any], min_keep: int = 1) -> Callable[..., Any]:
    """``allocate_slots`` that shortens unclaimed holds (`Holds.victim` first) before it returns
    None: a guess at what is missing first, then twice as much each time it is not enough."""

    @functools.wraps(allocate)
    def allocate_slots(request: Any, *args: Any, **kwargs: Any) -> Any:
        blocks = allocate(request, *args, **kwargs)
        step = _shortfall(scheduler, args, kwargs) if blocks is None else 0
        while blocks is None and (hold := holds.victim()) is not None:
            shorten(scheduler, holds, hold, step, min_keep)
            blocks = allocate(request, *args, **kwargs)
            step *= 2
        if blocks is None and holds.refused(request.request_id):
            _log_wait(scheduler, holds, request.request_id)
        return blocks

    return allocate_slots


def trim(scheduler: Any, holds: Holds, min_free: int | None, min_keep: int = 1) -> None:
    """Shorten holds (`Holds.victim` first) until `min_free` blocks are free, or none is left."""
    if min_free is None:
        return
    pool = scheduler.kv_cache_manager.block_pool
    while (short := min_free - pool.get_num_free_blocks()) > 0 and (hold := holds.victim()) is not None:
        shorten(scheduler, holds, hold, short, min_keep)


def _min_keep(scheduler: Any) -> int:
    """The fewest blocks a shortened hold keeps: those of ``kv_recompute_threshold`` tokens, below
    which prefill would not read it anyway."""
    sender = getattr(getattr(scheduler, "connector", None), "connector_scheduler", None)
    threshold = int(getattr(sender, "kv_recompute_threshold", 0) or 0)
    size = _block_size(scheduler)
    return max(1, -(-threshold // size)) if size > 0 else 1


def _hold_of(request: Any) -> bool:
    """Whether a finished request's blocks stay for a later read by prefill (decode's hold)."""
    params = getattr(request, "kv_transfer_params", None)
    return isinstance(params, dict) and not params.get("do_remote_decode")


def patch_scheduler(
    module: Any, valve: bool, max_fraction: float | None = None, shorten: bool = False, lease: float = CLAIM_LEASE_S
) -> bool:
    """Install the bookkeeping and the valve on vLLM's Scheduler; True if patched now."""
    cls = getattr(module, "Scheduler", None)
    needed = ("_free_request", "_free_blocks", "_update_from_kv_xfer_finished")
    if cls is None or not all(hasattr(cls, name) for name in needed):
        logger.error("pdx plugin: this vLLM's Scheduler lacks %s; held KV is freed only by the TTL", needed)
        return False
    if getattr(cls, _MARK, False):
        return False
    init, free_request, finished = cls.__init__, cls._free_request, cls._update_from_kv_xfer_finished

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._pdx_holds = Holds(valve, shorten=shorten, lease=lease)
        manager = self.kv_cache_manager
        self._pdx_min_keep = _min_keep(self)
        manager.allocate_slots = wrap_allocate(self, self._pdx_holds, manager.allocate_slots, self._pdx_min_keep)
        total = int(manager.block_pool.num_gpu_blocks)
        # held KV keeps at most max_fraction of the cache from new work: the rest stays free
        self._pdx_min_free = total - int(max_fraction * total) if max_fraction is not None and valve else None

    @functools.wraps(free_request)
    def _free_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        out = free_request(self, request, *args, **kwargs)
        if request.request_id in self.requests and _hold_of(request):
            self._pdx_holds.add(request.request_id)
            if self._pdx_holds.valve:
                supersede(self, self._pdx_holds, request.request_id)
            trim(self, self._pdx_holds, self._pdx_min_free, self._pdx_min_keep)
            note_releases(out[0] if isinstance(out, tuple) else out, self._pdx_holds)
        return out

    @functools.wraps(finished)
    def _update_from_kv_xfer_finished(self: Any, output: Any, *args: Any, **kwargs: Any) -> Any:
        sent = output.finished_sending
        if sent:
            output.finished_sending = self._pdx_holds.finished(set(sent))
        return finished(self, output, *args, **kwargs)

    cls.__init__ = __init__
    cls._free_request = _free_request
    cls._update_from_kv_xfer_finished = _update_from_kv_xfer_finished
    setattr(cls, _MARK, True)
    cap = f", held KV at most {max_fraction:g} of the cache" if max_fraction is not None and valve else ""
    logger.info("pdx plugin: held KV yields to new work under pressure (valve %s%s)", "on" if valve else "off", cap)
    return True


def note_releases(params: Any, holds: Holds) -> None:
    """Name the latest early releases in a held turn's answer (`contract.ReleasedNote`).
    `_free_request` returns the params (vLLM 0.26) or them and the encoder's (0.32)."""
    if not isinstance(params, dict):
        return
    kept = holds.latest_kept()
    if holds.seq == 0 and not kept:
        return
    note = contract.ReleasedNote.latest(holds.seq, holds.released_after, holds.covered, kept)
    params[contract.RELEASED_KV] = note.to_json()


def _local_turn(params: Any) -> bool:
    """A request that asks decode for neither read: a decode-local turn, prefilled on decode."""
    return (
        isinstance(params, dict)
        and all(params.get(flag) is value for flag, value in contract.LOCAL_TURN_KV.items())
        and not params.get("_remote_blocks_processed")
    )


def wrap_update_state_after_alloc(original: Callable[..., Any]) -> Callable[..., Any]:
    """NIXL's scheduler-side ``update_state_after_alloc`` that also enters a decode-local turn in
    the batch its worker tracks.

    With bidirectional transfer decode holds every finished turn, the local ones included, but
    vLLM's worker tracks a hold (frees it on prefill's read notice, or at its TTL) only for a
    request that was in a batch with transfer parameters it acts on (``_reqs_in_batch``). A
    local turn's request carries both flags false, so its hold was never tracked: prefill's read
    notice was dropped ("unrecognized request") and neither the read nor the TTL freed it, only
    the valve (never, with the valve off)."""

    @functools.wraps(original)
    def update_state_after_alloc(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        local = _local_turn(getattr(request, "kv_transfer_params", None))
        out = original(self, request, *args, **kwargs)
        sched = getattr(self, "connector_scheduler", None)
        batch = getattr(sched, "_reqs_in_batch", None)
        if local and getattr(sched, "is_bidirectional_kv_xfer_enabled", False) and isinstance(batch, set):
            batch.add(request.request_id)
        return out

    return update_state_after_alloc


def patch_connector(module: Any) -> bool:
    """Track decode-local turns' holds in NIXL's worker (`wrap_update_state_after_alloc`)."""
    cls = getattr(module, "NixlBaseConnector", None)
    if cls is None or not hasattr(cls, "update_state_after_alloc"):
        logger.error("pdx plugin: %s has no NixlBaseConnector; local turns' holds go by the valve only", CONNECTOR)
        return False
    if getattr(cls.update_state_after_alloc, _MARK, False):
        return False
    wrapped = wrap_update_state_after_alloc(cls.update_state_after_alloc)
    setattr(wrapped, _MARK, True)
    cls.update_state_after_alloc = wrapped
    return True


def answer(scheduler: Any, request: contract.HoldsRequest) -> contract.HoldsAnswer:
    """The EngineCore side of ``POST /v1/pdx/holds``."""
    holds: Holds | None = getattr(scheduler, "_pdx_holds", None)
    if holds is None:  # not patched: claims cannot pin anything, so none is granted
        return contract.HoldsAnswer(valve=False)
    dropped = list(request.release_claim)
    holds.release_claim(dropped)
    let_covered_go(scheduler, holds, dropped)
    held = holds.claim(list(request.claim), leased=request.lease)
    if request.release_unclaimed:
        for hold in holds.unclaimed():
            release(scheduler, holds, hold, pressure=False)
    released = holds.released_after(request.since)
    return contract.HoldsAnswer(
        held=held,
        claim_expiry=time.perf_counter() + holds.lease if held and request.lease else None,
        claimed=holds.claimed(),
        lapsed=holds.lapsed,
        kept=holds.kept(held),
        held_blocks=held_blocks(scheduler, holds),
        capacity_blocks=int(scheduler.kv_cache_manager.block_pool.num_gpu_blocks),
        releases=holds.releases,
        trims=holds.trims,
        released=released,
        covered=holds.covered(released),
        seq=holds.seq,
        waited=holds.waited,
        valve=holds.valve,
    )


def patch_engine_core(module: Any) -> bool:
    """Add the utility method the route calls (``EngineCore.pdx_holds``)."""
    cls = getattr(module, "EngineCore", None)
    if cls is None or hasattr(cls, holds_route.UTILITY):
        return False

    def pdx_holds(self: Any, body: dict[str, Any]) -> dict[str, Any]:
        return answer(self.scheduler, contract.HoldsRequest.model_validate(body)).to_json()

    setattr(cls, holds_route.UTILITY, pdx_holds)
    return True


def register() -> None:
    """Entry point of the ``vllm.general_plugins`` group; safe to call repeatedly."""
    from pdx_engine.import_hook import module_exists, on_import

    valve, max_fraction, shorten = valve_from_env(), max_fraction_from_env(), shorten_from_env()
    lease = lease_from_env()
    if not module_exists(SCHEDULER) or not module_exists(ENGINE_CORE):
        logger.error("pdx plugin: this vLLM has no %s; held KV is freed only by the TTL", SCHEDULER)
        return
    on_import(SCHEDULER, lambda m: patch_scheduler(m, valve, max_fraction, shorten, lease))
    on_import(ENGINE_CORE, patch_engine_core)
    if module_exists(CONNECTOR):
        on_import(CONNECTOR, patch_connector)
    holds_route.register()
