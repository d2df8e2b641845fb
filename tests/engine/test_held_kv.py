"""Decode's held KV yields to work: LRU release of unclaimed holds before a request waits."""

from __future__ import annotations

import itertools
import logging
import re
import time
import types
from dataclasses import dataclass, field
from typing import Any

import pytest

from pdx_contract import holds as contract
from pdx_engine import held_kv
from pdx_engine.held_kv import Holds


def test_the_victim_is_the_youngest_unclaimed_hold() -> None:
    holds = Holds()
    for hold in ("a", "b", "c"):
        holds.add(hold)
    assert holds.victim() == "c"
    assert holds.claim(["c"]) == ["c"]  # a claim pins it
    assert holds.victim() == "b"
    holds.claim(["a", "b"])
    assert holds.victim() is None
    holds.release_claim(["a"])
    assert holds.victim() == "a"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _cycle(holds: Holds, clock: Clock, names: list[str], gap: float) -> None:
    """Each conversation's turn ends, and `gap` later its next turn claims it (read, freed)."""
    for name in names:
        holds.add(name)
        clock.now += gap / len(names)
    for name in names:
        holds.claim([name])
        holds.finished({name})
        clock.now += gap / len(names)


def test_once_gaps_are_known_the_youngest_hold_goes_first_its_turn_comes_last() -> None:
    clock = Clock()
    holds = Holds(clock=clock)
    _cycle(holds, clock, ["a", "b", "c", "d"], gap=10.0)
    assert holds.typical_gap() == pytest.approx(10.0)
    for name in ("a", "b", "c"):  # round-robin agents: a's turn is next, c's last
        holds.add(name)
        clock.now += 2.5
    assert holds.victim() == "c"


def test_a_hold_idle_for_twice_the_typical_gap_goes_before_any_other() -> None:
    clock = Clock()
    holds = Holds(clock=clock)
    _cycle(holds, clock, ["a", "b", "c", "d"], gap=10.0)
    holds.add("abandoned")
    clock.now += 25.0  # over 2 typical gaps: its conversation has likely ended
    holds.add("fresh")
    assert holds.victim() == "abandoned"


def test_before_any_gap_is_measured_the_youngest_goes_first_and_none_is_stale() -> None:
    clock = Clock()
    holds = Holds(clock=clock)
    holds.add("old")
    clock.now += 1000.0
    holds.add("new")
    assert holds.typical_gap() is None and holds.victim() == "new"


def test_a_claim_names_only_holds_still_kept() -> None:
    holds = Holds()
    holds.add("a")
    holds.released("a")
    assert holds.claim(["a", "never"]) == []
    assert holds.releases == 1


def test_claims_nest_and_an_extra_release_of_a_claim_is_harmless() -> None:
    holds = Holds()
    holds.add("a")
    holds.claim(["a"])
    holds.claim(["a"])
    holds.release_claim(["a"])
    assert holds.victim() is None
    holds.release_claim(["a", "a", "unknown"])
    assert holds.victim() == "a"


def test_the_valve_off_never_offers_a_victim() -> None:
    holds = Holds(valve=False)
    holds.add("a")
    assert holds.victim() is None


def test_the_workers_late_report_of_a_released_hold_is_swallowed_once() -> None:
    holds = Holds()
    holds.add("a")
    holds.add("b")
    holds.released("a")
    assert holds.finished({"a", "b", "x"}) == {"b", "x"}
    assert "b" not in holds
    assert holds.finished({"a"}) == {"a"}  # reported twice: the second is not ours to swallow


def test_releases_are_named_after_the_callers_last_count_and_all_after_a_restart() -> None:
    holds = Holds()
    for hold in "abc":
        holds.add(hold)
    holds.released("a")
    holds.released("b")
    assert holds.released_after(0) == ["a", "b"]
    assert holds.released_after(1) == ["b"]
    assert holds.released_after(2) == []
    assert holds.released_after(9) == ["a", "b"]  # the caller saw an engine that has since restarted


# ---------------------------------------------------------------- the scheduler patch, on fakes


_TOKENS = itertools.count()


@dataclass
class FakeRequest:
    request_id: str
    kv_transfer_params: dict[str, Any] | None = None
    finished: bool = True
    all_token_ids: list[int] = field(default_factory=list)

    def is_finished(self) -> bool:
        return self.finished


@dataclass
class FakePool:
    num_gpu_blocks: int
    free: int
    freed: list[int] = field(default_factory=list)  # every block given back, in order

    def get_num_free_blocks(self) -> int:
        return self.free

    def free_blocks(self, ordered: Any) -> None:
        blocks = list(ordered)
        self.free += len(blocks)
        self.freed.extend(blocks)


@dataclass
class FakeGroup:
    """vLLM's single-type manager: a request's blocks in order, and how many are hashed."""

    block_pool: FakePool
    block_size: int
    req_to_blocks: dict[str, list[int]] = field(default_factory=dict)
    num_cached_block: dict[str, int] = field(default_factory=dict)


@dataclass
class FakeManager:
    pool: FakePool
    block_size: int = 1  # one token a block: a request's "num_new_tokens" is its blocks
    next_id: int = 0
    group: FakeGroup = field(init=False)

    def __post_init__(self) -> None:
        self.group = FakeGroup(self.pool, self.block_size)
        self.coordinator = types.SimpleNamespace(single_type_managers=(self.group,))

    @property
    def block_pool(self) -> FakePool:
        return self.pool

    @property
    def ids(self) -> dict[str, list[int]]:
        return self.group.req_to_blocks

    def allocate_slots(self, request: FakeRequest, blocks: int) -> list[int] | None:
        if blocks > self.pool.free:
            return None
        self.pool.free -= blocks
        new = list(range(self.next_id, self.next_id + blocks))
        self.next_id += blocks
        self.ids.setdefault(request.request_id, []).extend(new)
        self.group.num_cached_block[request.request_id] = len(self.ids[request.request_id])
        return new

    def get_block_ids(self, req_id: str) -> tuple[list[int], ...]:
        return (self.ids[req_id],)

    def free(self, req_id: str) -> None:
        self.group.num_cached_block.pop(req_id, None)
        self.pool.free_blocks(reversed(self.ids.pop(req_id, [])))


class FakeSender:
    def __init__(self) -> None:
        self._reqs_need_send: dict[str, float] = {}


class FakeScheduler:
    """The parts of vLLM's Scheduler the plugin touches, with its real method names."""

    def __init__(self, blocks: int, threshold: int = 0) -> None:
        self.kv_cache_manager = FakeManager(FakePool(blocks, blocks))
        self.requests: dict[str, FakeRequest] = {}
        sender = FakeSender()
        sender.kv_recompute_threshold = threshold  # type: ignore[attr-defined]
        self.connector = types.SimpleNamespace(connector_scheduler=sender)
        self.freed_by_vllm: list[str] = []

    def _free_request(self, request: FakeRequest, delay_free_blocks: bool = False) -> None:
        if not delay_free_blocks:
            self._free_blocks(request)

    def _free_blocks(self, request: FakeRequest) -> None:
        self.kv_cache_manager.free(request.request_id)
        del self.requests[request.request_id]

    def _update_from_kv_xfer_finished(self, output: Any) -> None:
        for req_id in output.finished_sending or ():
            assert req_id in self.requests  # vLLM's own assertion
            self.freed_by_vllm.append(req_id)
            self._free_blocks(self.requests[req_id])


@pytest.fixture
def patched() -> type[FakeScheduler]:
    module = types.ModuleType(held_kv.SCHEDULER)
    cls = type("Scheduler", (FakeScheduler,), {})
    module.Scheduler = cls  # type: ignore[attr-defined]
    assert held_kv.patch_scheduler(module, valve=True, shorten=True)
    assert not held_kv.patch_scheduler(module, valve=True, shorten=True)  # once only
    return cls


def _finish_turn(sched: FakeScheduler, req_id: str, blocks: int, tokens: list[int] | None = None) -> None:
    """A decode turn that ends holding its blocks (a token each) for the next turn's prefill."""
    ids = tokens if tokens is not None else [next(_TOKENS) for _ in range(blocks)]
    request = FakeRequest(req_id, {"do_remote_prefill": False, "do_remote_decode": False}, all_token_ids=ids)
    sched.requests[req_id] = request
    assert sched.kv_cache_manager.allocate_slots(request, blocks) is not None
    sched._free_request(request, delay_free_blocks=True)


def test_a_request_that_does_not_fit_releases_held_turns_youngest_first(patched: type[FakeScheduler]) -> None:
    sched = patched(blocks=10)
    for req_id in ("old", "mid", "new"):
        _finish_turn(sched, req_id, 3)
    fresh = FakeRequest("fresh", finished=False)
    sched.requests["fresh"] = fresh
    assert sched.kv_cache_manager.allocate_slots(fresh, 5) is not None
    assert "new" not in sched.requests and "mid" not in sched.requests and "old" in sched.requests
    assert sched.connector.connector_scheduler._reqs_need_send == {"new": float("-inf"), "mid": float("-inf")}
    answer = held_kv.answer(sched, contract.HoldsRequest())
    assert answer.releases == 2 and answer.held_blocks == 3 and answer.capacity_blocks == 10
    assert answer.waited == 0  # it found room: it never waited


def test_asked_to_release_the_unclaimed_holds_decode_frees_all_but_the_claimed_ones(
    patched: type[FakeScheduler],
) -> None:
    sched = patched(blocks=10)
    for req_id in ("a", "b", "c"):
        _finish_turn(sched, req_id, 3)
    assert held_kv.answer(sched, contract.HoldsRequest(claim=["b"])).held == ["b"]
    answer = held_kv.answer(sched, contract.HoldsRequest(release_unclaimed=True))
    assert "a" not in sched.requests and "c" not in sched.requests and "b" in sched.requests
    assert sorted(answer.released) == ["a", "c"]  # routers learn of them as of any early release
    assert (answer.releases, answer.held_blocks) == (0, 3)  # not pressure; the claimed one stays


def test_with_the_valve_off_a_request_waits_behind_held_kv_and_is_counted() -> None:
    module = types.ModuleType(held_kv.SCHEDULER)
    module.Scheduler = type("Scheduler", (FakeScheduler,), {})  # type: ignore[attr-defined]
    held_kv.patch_scheduler(module, valve=False)
    sched = module.Scheduler(blocks=4)
    _finish_turn(sched, "a", 4)
    assert sched.kv_cache_manager.allocate_slots(FakeRequest("b", finished=False), 1) is None
    answer = held_kv.answer(sched, contract.HoldsRequest())
    assert (answer.waited, answer.releases, answer.valve) == (1, 0, False)


def test_a_request_refused_with_nothing_held_is_not_blamed_on_held_kv() -> None:
    holds = Holds()
    holds.refused("r")
    assert holds.waited == 0


def test_a_claimed_hold_is_never_released_and_the_request_then_waits(
    patched: type[FakeScheduler], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="vllm.pdx_plugin")
    sched = patched(blocks=6)
    _finish_turn(sched, "read-in-flight", 3)
    _finish_turn(sched, "idle", 3)
    assert held_kv.answer(sched, contract.HoldsRequest(claim=["read-in-flight"])).held == ["read-in-flight"]
    big = FakeRequest("big", finished=False)
    assert sched.kv_cache_manager.allocate_slots(big, 6) is None  # vLLM waits, as before
    assert sched.kv_cache_manager.allocate_slots(big, 6) is None  # the next step: counted once
    assert "read-in-flight" in sched.requests and "idle" not in sched.requests
    assert held_kv.answer(sched, contract.HoldsRequest()).waited == 1
    waits = [r.getMessage() for r in caplog.records if "waits for blocks" in r.getMessage()]
    assert len(waits) == 1 and re.fullmatch(
        r"pdx plugin: request big waits for blocks with held KV present \(all 1 holds are claimed, for 0\.\d\d s\):"
        r" 3 blocks free, 3 held",
        waits[0],
    ), waits  # said once, with what decode's log needs to tell the wait apart (how long the claim has pinned)
    held_kv.answer(sched, contract.HoldsRequest(release_claim=["read-in-flight"]))
    assert sched.kv_cache_manager.allocate_slots(big, 6) is not None


def test_the_workers_report_of_a_released_hold_does_not_trip_vllms_assertion(patched: type[FakeScheduler]) -> None:
    sched = patched(blocks=4)
    _finish_turn(sched, "a", 2)
    _finish_turn(sched, "b", 2)
    sched.kv_cache_manager.allocate_slots(FakeRequest("c", finished=False), 2)
    sched._update_from_kv_xfer_finished(types.SimpleNamespace(finished_sending={"a", "b"}))
    assert sched.freed_by_vllm == ["a"]  # b (the younger) was freed by the valve already
    assert held_kv.answer(sched, contract.HoldsRequest(claim=["a", "b"])).held == []


def test_a_claim_on_a_released_hold_is_refused_so_the_router_recomputes(patched: type[FakeScheduler]) -> None:
    sched = patched(blocks=3)
    _finish_turn(sched, "a", 3)
    sched.kv_cache_manager.allocate_slots(FakeRequest("b", finished=False), 3)
    answer = held_kv.answer(sched, contract.HoldsRequest(claim=["a"]))
    assert answer.held == [] and answer.released == ["a"] and answer.seq == 1
    assert answer.covered == []  # its blocks went to b: no younger hold of a's keeps them
    assert held_kv.answer(sched, contract.HoldsRequest(since=answer.seq)).released == []


def test_a_request_short_of_a_few_blocks_takes_only_those_from_the_youngest_holds_tail(
    patched: type[FakeScheduler],
) -> None:
    sched = patched(blocks=10)
    _finish_turn(sched, "old", 3)
    _finish_turn(sched, "new", 5)  # blocks 3..7; 2 blocks free
    tail = sched.kv_cache_manager.ids["new"][3:]
    assert sched.kv_cache_manager.allocate_slots(FakeRequest("fresh", finished=False), 4) is not None
    assert sched.kv_cache_manager.ids["new"] == [3, 4, 5] and sched.kv_cache_manager.ids["old"] == [0, 1, 2]
    assert sched.kv_cache_manager.pool.freed == tail[::-1]  # the tail's last block first, as vLLM frees
    assert sched.kv_cache_manager.group.num_cached_block["new"] == 3
    answer = held_kv.answer(sched, contract.HoldsRequest(claim=["new", "old"]))
    assert answer.held == ["new", "old"] and answer.kept == {"new": 3}  # tokens: one a block here
    assert (answer.trims, answer.releases, answer.held_blocks) == (1, 0, 6)


def test_a_shortened_holds_read_frees_what_it_kept(patched: type[FakeScheduler]) -> None:
    sched = patched(blocks=6)
    _finish_turn(sched, "a", 6)
    sched.kv_cache_manager.allocate_slots(FakeRequest("b", finished=False), 2)
    assert sched.kv_cache_manager.pool.free == 0 and len(sched.kv_cache_manager.ids["a"]) == 4
    sched._update_from_kv_xfer_finished(types.SimpleNamespace(finished_sending={"a"}))
    assert sched.freed_by_vllm == ["a"]  # not swallowed: the prefix was still decode's to free
    assert sched.kv_cache_manager.pool.free == 4 and "a" not in sched.kv_cache_manager.group.num_cached_block
    assert held_kv.answer(sched, contract.HoldsRequest(claim=["a"])).kept == {}


def test_a_hold_that_would_keep_less_than_the_recompute_threshold_is_released_whole(
    patched: type[FakeScheduler],
) -> None:
    sched = patched(blocks=6, threshold=3)  # prefill reads no fewer than 3 tokens (blocks here)
    _finish_turn(sched, "a", 4)
    sched.kv_cache_manager.allocate_slots(FakeRequest("b", finished=False), 4)  # a would keep 2
    assert "a" not in sched.requests
    answer = held_kv.answer(sched, contract.HoldsRequest(claim=["a"]))
    assert (answer.held, answer.released, answer.trims) == ([], ["a"], 0)


def _bet(holds: Holds, hold: str, read: bool) -> None:
    """A hold shortened under pressure, then read (claimed) or released under pressure."""
    holds.add(hold)
    holds.shortened(hold, 128)
    if read:
        holds.claim([hold])
    else:
        holds.released(hold)


def test_shortening_stops_while_shortened_holds_are_released_unread_and_resumes_as_losses_age() -> None:
    clock = Clock()
    holds = Holds(clock=clock, shorten=True)
    for i in range(held_kv.MIN_BETS - 1):
        _bet(holds, f"lost-{i}", read=False)
    assert holds.shortening()  # too few bets to say
    _bet(holds, "lost-last", read=False)
    assert not holds.shortening()  # every recent shortened hold went unread: release whole
    clock.now += held_kv.BETS_WINDOW_S + 1
    assert holds.shortening()  # those losses aged out: shortening is tried again


def test_shortening_goes_on_while_enough_shortened_holds_are_read() -> None:
    holds = Holds(clock=Clock(), shorten=True)
    for i in range(12):
        _bet(holds, f"h{i}", read=i % 4 == 0)  # a quarter read
    assert holds.shortening()
    _bet(holds, "another-loss", read=False)  # 3 of 13 read: under a quarter
    assert not holds.shortening()
    assert not Holds(shorten=False).shortening()


def test_a_shortened_hold_that_is_read_by_its_conversation_on_decode_is_a_won_bet() -> None:
    holds = Holds(clock=Clock(), shorten=True)
    for i in range(held_kv.MIN_BETS):
        holds.add(f"h{i}")
        holds.shortened(f"h{i}", 128)
        holds.came_back(f"h{i}")  # a decode-local turn used its prefix (`supersede`)
    assert holds.shortening()
    holds.add("x")
    holds.shortened("x", 128)
    holds.gone("x")  # vLLM freed it itself (read, TTL): no bet settled either way
    assert holds.shortening()


def test_once_shortening_loses_a_request_releases_a_hold_whole(patched: type[FakeScheduler]) -> None:
    sched = patched(blocks=10)
    for i in range(held_kv.MIN_BETS):
        _bet(sched._pdx_holds, f"lost-{i}", read=False)  # type: ignore[attr-defined]
    _finish_turn(sched, "a", 5)
    sched.kv_cache_manager.allocate_slots(FakeRequest("b", finished=False), 6)  # short of one block
    assert "a" not in sched.requests  # whole, where it would have given one block


def test_a_hybrid_models_hold_is_released_whole_never_cut(patched: type[FakeScheduler]) -> None:
    sched = patched(blocks=6)
    _finish_turn(sched, "a", 6)
    manager = sched.kv_cache_manager
    manager.coordinator = types.SimpleNamespace(single_type_managers=(manager.group, manager.group))
    manager.allocate_slots(FakeRequest("b", finished=False), 1)
    assert "a" not in sched.requests and manager.pool.free == 5


def test_an_unpatched_engine_grants_no_claim() -> None:
    answer = held_kv.answer(types.SimpleNamespace(), contract.HoldsRequest(claim=["a"]))
    assert answer.held == [] and not answer.valve


def test_a_scheduler_without_the_patched_methods_is_logged_as_an_error(caplog: pytest.LogCaptureFixture) -> None:
    module = types.ModuleType(held_kv.SCHEDULER)
    module.Scheduler = type("Scheduler", (), {})  # type: ignore[attr-defined]
    with caplog.at_level(logging.ERROR, logger="vllm.pdx_plugin"):
        assert not held_kv.patch_scheduler(module, valve=True)
    assert "held KV is freed only by the TTL" in caplog.text


@pytest.mark.parametrize(("raw", "on"), [("", True), ("1", True), ("0", False)])
def test_the_valve_is_on_unless_turned_off(raw: str, on: bool) -> None:
    assert held_kv.valve_from_env({held_kv.ENV: raw}) is on


def test_a_bad_valve_setting_names_the_variable_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"PDX_HELD_KV_VALVE='yes': expected 1 .* or 0, or unset it"):
        held_kv.valve_from_env({held_kv.ENV: "yes"})


def test_held_kv_past_its_share_of_the_cache_is_given_back_as_the_turn_ends() -> None:
    module = types.ModuleType(held_kv.SCHEDULER)
    module.Scheduler = type("Scheduler", (FakeScheduler,), {})  # type: ignore[attr-defined]
    assert held_kv.patch_scheduler(module, valve=True, max_fraction=0.5, shorten=True)
    sched = module.Scheduler(blocks=10)  # 5 blocks kept free of held KV
    _finish_turn(sched, "old", 3)
    _finish_turn(sched, "new", 3)  # 4 free < 5: the youngest gives a block at once, before any request needs room
    answer = held_kv.answer(sched, contract.HoldsRequest(claim=["new"]))
    assert (answer.held_blocks, answer.trims, answer.kept) == (5, 1, {"new": 2})
    assert "old" in sched.requests and sched.kv_cache_manager.pool.free == 5
    _finish_turn(sched, "third", 3)  # 2 free: third goes whole (min 1 block kept, so 3 to free)
    assert held_kv.answer(sched, contract.HoldsRequest()).released == ["third"]


@pytest.mark.parametrize(("raw", "share"), [("", None), ("0.5", 0.5), ("1", 1.0)])
def test_the_held_kv_share_is_read_from_the_environment(raw: str, share: float | None) -> None:
    assert held_kv.max_fraction_from_env({held_kv.FRACTION_ENV: raw}) == share


@pytest.mark.parametrize("raw", ["0", "1.5", "half", "nan"])
def test_a_bad_held_kv_share_names_the_variable_and_the_fix(raw: str) -> None:
    with pytest.raises(ValueError, match=r"PDX_HELD_KV_MAX_FRACTION=.*a share of decode.s KV cache in \(0, 1\]"):
        held_kv.max_fraction_from_env({held_kv.FRACTION_ENV: raw})


def test_blocks_two_holds_share_through_the_prefix_cache_count_once(patched: type[FakeScheduler]) -> None:
    sched = patched(blocks=10)
    _finish_turn(sched, "turn-1", 3)
    _finish_turn(sched, "turn-2", 2)
    ids = sched.kv_cache_manager.ids
    ids["turn-2"] = [*ids["turn-1"][:2], *ids["turn-2"]]  # a later turn of the same conversation
    assert held_kv.answer(sched, contract.HoldsRequest()).held_blocks == 5


def _turn_sharing(
    sched: FakeScheduler, req_id: str, shared_from: str, shared: int, new: int, tokens: list[int]
) -> None:
    """A turn that ran on decode from its prefix cache: `shared` of `shared_from`'s blocks, then
    `new` of its own, holding `tokens`, ends holding them."""
    request = FakeRequest(req_id, {"do_remote_prefill": False, "do_remote_decode": False}, all_token_ids=tokens)
    sched.requests[req_id] = request
    manager = sched.kv_cache_manager
    assert manager.allocate_slots(request, new) is not None
    manager.ids[req_id] = [*manager.ids[shared_from][:shared], *manager.ids[req_id]]
    sched._free_request(request, delay_free_blocks=True)


def test_a_turn_that_holds_all_an_earlier_hold_holds_supersedes_it_without_counting_as_pressure(
    patched: type[FakeScheduler],
) -> None:
    sched = patched(blocks=20)
    sched.kv_cache_manager.group.block_size = 2
    _finish_turn(sched, "turn-1", 2, tokens=[1, 2, 3])  # a whole block and a partial one
    _turn_sharing(sched, "turn-2", "turn-1", shared=1, new=2, tokens=[1, 2, 3, 4, 5])
    answer = held_kv.answer(sched, contract.HoldsRequest(claim=["turn-1", "turn-2"]))
    assert answer.held == ["turn-2"] and answer.released == ["turn-1"]
    assert (answer.releases, answer.seq) == (0, 1)  # the router learns of it; no pressure counted
    assert answer.covered == ["turn-1"]  # and that turn-2 keeps its blocks: a retried turn may go local


@pytest.mark.parametrize(
    ("tokens", "shared"),
    [([1, 2, 9, 4, 5], 1), ([7, 8, 3, 4, 5], 0)],
    ids=["partial-block-differs", "no-block-shared"],
)
def test_a_turn_that_does_not_hold_all_of_an_earlier_hold_leaves_it(
    patched: type[FakeScheduler], tokens: list[int], shared: int
) -> None:
    sched = patched(blocks=20)
    sched.kv_cache_manager.group.block_size = 2
    _finish_turn(sched, "turn-1", 2, tokens=[1, 2, 3])
    _turn_sharing(sched, "other", "turn-1", shared=shared, new=3 - shared, tokens=tokens)
    assert held_kv.answer(sched, contract.HoldsRequest(claim=["turn-1"])).held == ["turn-1"]


def test_a_claimed_hold_is_not_superseded_under_a_read(patched: type[FakeScheduler]) -> None:
    sched = patched(blocks=20)
    _finish_turn(sched, "turn-1", 2, tokens=[1, 2])
    held_kv.answer(sched, contract.HoldsRequest(claim=["turn-1"]))
    _turn_sharing(sched, "turn-2", "turn-1", shared=2, new=1, tokens=[1, 2, 3])
    assert held_kv.answer(sched, contract.HoldsRequest(claim=["turn-1"])).held == ["turn-1"]


def test_a_claimed_hold_a_younger_one_covers_goes_as_superseded_once_its_claim_is_dropped(
    patched: type[FakeScheduler],
) -> None:
    """A decode-local turn on a pressed decode claims the hold it extends; its own hold covers
    that one by the time the router drops the claim."""
    sched = patched(blocks=20)
    _finish_turn(sched, "turn-1", 2, tokens=[1, 2])
    held_kv.answer(sched, contract.HoldsRequest(claim=["turn-1"]))
    _turn_sharing(sched, "turn-2", "turn-1", shared=2, new=1, tokens=[1, 2, 3])
    answer = held_kv.answer(sched, contract.HoldsRequest(release_claim=["turn-1"]))
    assert answer.released == ["turn-1"] and answer.covered == ["turn-1"]
    assert answer.releases == 0  # not pressure
    assert held_kv.answer(sched, contract.HoldsRequest(claim=["turn-2"])).held == ["turn-2"]


def test_a_dropped_claim_leaves_a_hold_no_younger_one_covers(patched: type[FakeScheduler]) -> None:
    sched = patched(blocks=20)
    _finish_turn(sched, "turn-1", 2, tokens=[1, 2])
    held_kv.answer(sched, contract.HoldsRequest(claim=["turn-1"]))
    answer = held_kv.answer(sched, contract.HoldsRequest(release_claim=["turn-1"]))
    assert answer.released == [] and answer.claimed == 0
    assert held_kv.answer(sched, contract.HoldsRequest(claim=["turn-1"])).held == ["turn-1"]


def test_by_default_a_hold_goes_whole() -> None:
    module = types.ModuleType(held_kv.SCHEDULER)
    module.Scheduler = type("Scheduler", (FakeScheduler,), {})  # type: ignore[attr-defined]
    assert held_kv.patch_scheduler(module, valve=True)
    sched = module.Scheduler(blocks=6)
    _finish_turn(sched, "a", 6)
    sched.kv_cache_manager.allocate_slots(FakeRequest("b", finished=False), 2)
    answer = held_kv.answer(sched, contract.HoldsRequest(claim=["a"]))
    assert (answer.held, answer.released, answer.trims) == ([], ["a"], 0)


@pytest.mark.parametrize(("raw", "on"), [("", False), ("1", True), ("0", False)])
def test_holds_go_whole_unless_shortening_is_turned_on(raw: str, on: bool) -> None:
    assert held_kv.shorten_from_env({held_kv.SHORTEN_ENV: raw}) is on


def test_a_bad_shortening_setting_names_the_variable_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"PDX_HELD_KV_SHORTEN='yes': expected 1 .* or 0 .*, or unset it"):
        held_kv.shorten_from_env({held_kv.SHORTEN_ENV: "yes"})


def test_conversations_that_come_back_on_decode_measure_the_gap_so_an_ended_one_goes_first(
    patched: type[FakeScheduler],
) -> None:
    # Decode-local turns make no claims: a superseded hold's turn is the conversation's return.
    sched = patched(blocks=200)
    holds: Holds = sched._pdx_holds  # type: ignore[attr-defined]
    clock = Clock()
    holds.clock = clock
    _finish_turn(sched, "ended", 2, tokens=[900, 901])
    for c in range(4):
        _finish_turn(sched, f"c{c}-1", 2, tokens=[c, 100 + c])
        clock.now += 10.0
        _turn_sharing(sched, f"c{c}-2", f"c{c}-1", shared=2, new=1, tokens=[c, 100 + c, 200 + c])
    assert holds.typical_gap() == pytest.approx(10.0)
    clock.now += 30.0  # "ended" has been idle for over twice the typical gap
    assert holds.victim() == "ended"


def test_a_leased_claim_pins_its_hold_until_the_lease_runs_out() -> None:
    clock = Clock()
    holds = Holds(clock=clock, lease=30.0)
    holds.add("read-in-flight")
    assert holds.claim(["read-in-flight"], leased=True) == ["read-in-flight"]
    clock.now += 29.0
    assert holds.victim() is None and holds.claimed() == 1
    clock.now += 2.0  # its router never dropped the claim: the lease is over, no read may start
    assert holds.victim() == "read-in-flight" and holds.claimed() == 0
    holds.released("read-in-flight")
    assert (holds.lapsed, holds.releases) == (1, 1)


def test_a_claim_taken_again_pins_for_a_lease_from_the_latest_claim() -> None:
    clock = Clock()
    holds = Holds(clock=clock, lease=30.0)
    holds.add("h")
    holds.claim(["h"], leased=True)
    clock.now += 20.0
    holds.claim(["h"], leased=True)  # another router replica's turn claims it too
    clock.now += 20.0
    assert holds.victim() is None


def test_a_claim_without_a_lease_pins_until_it_is_dropped() -> None:
    clock = Clock()
    holds = Holds(clock=clock, lease=30.0)
    holds.add("h")
    holds.claim(["h"])  # a router that does not cap its reads at the claim's expiry
    clock.now += 1e6
    assert holds.victim() is None
    holds.release_claim(["h"])
    assert holds.victim() == "h"
    holds.released("h")
    assert holds.lapsed == 0


def test_a_dropped_claim_taken_again_without_a_lease_is_not_cut_short_by_the_old_lease() -> None:
    clock = Clock()
    holds = Holds(clock=clock, lease=30.0)
    holds.add("h")
    holds.claim(["h"], leased=True)
    holds.release_claim(["h"])
    holds.claim(["h"])
    clock.now += 31.0
    assert holds.victim() is None


def test_the_claim_answer_names_the_lease_expiry_on_decodes_clock_and_counts_claims(
    patched: type[FakeScheduler],
) -> None:
    sched = patched(blocks=6)
    _finish_turn(sched, "a", 3)
    before = time.perf_counter()
    leased = held_kv.answer(sched, contract.HoldsRequest(claim=["a"], lease=True))
    assert leased.held == ["a"] and leased.claimed == 1
    assert leased.claim_expiry is not None
    assert before + held_kv.CLAIM_LEASE_S <= leased.claim_expiry <= time.perf_counter() + held_kv.CLAIM_LEASE_S
    unleased = held_kv.answer(sched, contract.HoldsRequest(claim=["a"]))
    assert unleased.claim_expiry is None and unleased.claimed == 1
    assert held_kv.answer(sched, contract.HoldsRequest(claim=["gone"], lease=True)).claim_expiry is None


def test_a_request_finds_room_in_a_hold_whose_claim_lapsed_and_the_lapse_is_counted(
    patched: type[FakeScheduler],
) -> None:
    sched = patched(blocks=6)
    clock = Clock()
    sched._pdx_holds.clock = clock  # type: ignore[attr-defined]
    _finish_turn(sched, "orphan", 6)
    held_kv.answer(sched, contract.HoldsRequest(claim=["orphan"], lease=True))  # its drop never comes
    big = FakeRequest("big", finished=False)
    sched.requests["big"] = big
    assert sched.kv_cache_manager.allocate_slots(big, 6) is None  # pinned while a read may start
    clock.now += held_kv.CLAIM_LEASE_S + 1
    assert sched.kv_cache_manager.allocate_slots(big, 6) is not None
    answer = held_kv.answer(sched, contract.HoldsRequest())
    assert (answer.lapsed, answer.claimed, answer.waited) == (1, 0, 1)


@pytest.mark.parametrize(("raw", "lease"), [("", held_kv.CLAIM_LEASE_S), ("45", 45.0), ("10", 10.0)])
def test_the_claim_lease_is_read_from_the_environment(raw: str, lease: float) -> None:
    assert held_kv.lease_from_env({held_kv.LEASE_ENV: raw}) == lease


@pytest.mark.parametrize("raw", ["5", "0", "-1", "soon", "nan"])
def test_a_bad_claim_lease_names_the_variable_and_the_fix(raw: str) -> None:
    with pytest.raises(ValueError, match=rf"{held_kv.LEASE_ENV}=.*at least 10.*or unset it"):
        held_kv.lease_from_env({held_kv.LEASE_ENV: raw})


class FakeNixlScheduler:
    def __init__(self, bidirectional: bool = True) -> None:
        self.is_bidirectional_kv_xfer_enabled = bidirectional
        self._reqs_in_batch: set[str] = set()


class FakeNixlConnector:
    """The scheduler side of vLLM's NixlBaseConnector: what its update_state_after_alloc does
    with the flags (enters only requests it reads or sends for)."""

    def __init__(self, bidirectional: bool = True) -> None:
        self.connector_scheduler = FakeNixlScheduler(bidirectional)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        params = request.kv_transfer_params
        sched = self.connector_scheduler
        bidirectional = sched.is_bidirectional_kv_xfer_enabled
        if params.get("do_remote_decode") or (params.get("do_remote_prefill") and bidirectional):
            sched._reqs_in_batch.add(request.request_id)
        if params.get("do_remote_prefill"):
            params["do_remote_prefill"] = False
            params["_remote_blocks_processed"] = True


@pytest.fixture
def connector() -> type[FakeNixlConnector]:
    module = types.ModuleType(held_kv.CONNECTOR)
    cls = type("NixlBaseConnector", (FakeNixlConnector,), {})
    module.NixlBaseConnector = cls  # type: ignore[attr-defined]
    assert held_kv.patch_connector(module)
    assert not held_kv.patch_connector(module)  # once only
    return cls


def test_a_decode_local_turn_enters_the_batch_nixls_worker_tracks_so_a_read_or_the_ttl_frees_its_hold(
    connector: type[FakeNixlConnector],
) -> None:
    conn = connector()
    local = FakeRequest("local", {"do_remote_decode": False, "do_remote_prefill": False})
    conn.update_state_after_alloc(local, None, 0)
    assert conn.connector_scheduler._reqs_in_batch == {"local"}


def test_a_landing_of_prefills_kv_is_entered_by_vllm_alone_and_plain_requests_not_at_all(
    connector: type[FakeNixlConnector],
) -> None:
    conn = connector()
    landing = FakeRequest("landing", {"do_remote_decode": False, "do_remote_prefill": True})
    conn.update_state_after_alloc(landing, None, 0)
    conn.update_state_after_alloc(landing, None, 0)  # allocated again (after a preemption)
    plain = FakeRequest("plain", {})
    conn.update_state_after_alloc(plain, None, 0)
    assert conn.connector_scheduler._reqs_in_batch == {"landing"}


def test_without_bidirectional_transfer_a_local_turn_holds_nothing_and_is_not_entered(
    connector: type[FakeNixlConnector],
) -> None:
    conn = connector(bidirectional=False)
    local = FakeRequest("local", {"do_remote_decode": False, "do_remote_prefill": False})
    conn.update_state_after_alloc(local, None, 0)
    assert conn.connector_scheduler._reqs_in_batch == set()


def test_a_vllm_without_the_nixl_connector_class_is_logged_as_an_error(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="vllm.pdx_plugin"):
        assert not held_kv.patch_connector(types.ModuleType(held_kv.CONNECTOR))
    assert "local turns' holds go by the valve only" in caplog.text


@pytest.mark.parametrize("shape", ["vllm-0.32", "vllm-0.26"])
def test_a_held_turns_answer_names_the_latest_early_releases(shape: str) -> None:
    class Answering(FakeScheduler):
        """`_free_request` returns the answer's kv_transfer_params: with the encoder's (0.32) or alone (0.26)."""

        def _free_request(self, request: FakeRequest, delay_free_blocks: bool = False) -> Any:
            super()._free_request(request, delay_free_blocks)
            params = {"do_remote_decode": True, "remote_request_id": request.request_id}
            return (params, None) if shape == "vllm-0.32" else params

    module = types.ModuleType(held_kv.SCHEDULER)
    module.Scheduler = type("Scheduler", (Answering,), {})  # type: ignore[attr-defined]
    assert held_kv.patch_scheduler(module, valve=True)
    sched = module.Scheduler(blocks=6)

    def finish(req_id: str) -> dict[str, Any]:
        request = FakeRequest(req_id, {"do_remote_prefill": False, "do_remote_decode": False}, all_token_ids=[1, 2, 3])
        sched.requests[req_id] = request
        assert sched.kv_cache_manager.allocate_slots(request, 3) is not None
        out = sched._free_request(request, delay_free_blocks=True)
        params: dict[str, Any] = out[0] if isinstance(out, tuple) else out
        return params

    assert contract.RELEASED_KV not in finish("a")  # nothing released yet: nothing to name
    finish("b")
    fresh = FakeRequest("fresh", finished=False)
    sched.requests["fresh"] = fresh
    assert sched.kv_cache_manager.allocate_slots(fresh, 2) is not None  # releases b, the youngest
    note = contract.ReleasedNote.model_validate(finish("c")[contract.RELEASED_KV])  # c's room releases a
    assert (note.since, note.seq, note.released, note.covered) == (0, 2, ["b", "a"], [])

    sched = module.Scheduler(blocks=6)  # a fresh engine, holds shortened under pressure
    sched._pdx_holds.shorten = True
    finish("d")
    assert sched.kv_cache_manager.allocate_slots(FakeRequest("grow", finished=False), 4) is not None  # d gives 1
    sched.kv_cache_manager.free("grow")
    note = contract.ReleasedNote.model_validate(finish("e")[contract.RELEASED_KV])  # no release: named for d's cut
    assert (note.seq, note.released, note.kept) == (0, [], {"d": 2})


def _round_robin_reuse(n: int, room: int, rounds: int, choose: Any) -> float:
    """Turns of `n` round-robin agents on a decode with room for `room` conversations' KV, the
    running turn's included: the share of later turns that find their hold. `choose(holds,
    upcoming)` names the hold to release when the running turn needs room."""
    clock = Clock()
    holds = Holds(clock=clock)
    order = [f"c{i}" for i in range(n)] * rounds
    reused = 0
    for at, name in enumerate(order):
        clock.now += 1.0
        if name in holds:
            reused += at >= n
            holds.claim([name])
            holds.finished({name})  # read by its next turn: the turn runs in its place
        while len(holds.ids()) >= room:
            holds.released(choose(holds, order[at + 1 :]))
        holds.add(name)
    return reused / (len(order) - n)


def _belady(holds: Holds, upcoming: list[str]) -> str:
    """The hold whose conversation comes back last (the best any choice can do)."""
    return max(holds.ids(), key=lambda h: upcoming.index(h) if h in upcoming else len(upcoming))


@pytest.mark.parametrize(("n", "room"), [(4, 2), (4, 3), (8, 3), (12, 7)])
def test_on_round_robin_agents_the_valve_reuses_as_many_turns_as_beladys_choice(n: int, room: int) -> None:
    valve = _round_robin_reuse(n, room, 20, lambda holds, _: holds.victim())
    best = _round_robin_reuse(n, room, 20, _belady)
    oldest_first = _round_robin_reuse(n, room, 20, lambda holds, _: holds.ids()[0])
    assert valve == pytest.approx(best)
    assert best == pytest.approx((room - 1) / (n - 1), abs=0.02)  # the bound the overcommit points meet
    assert oldest_first == 0.0  # least recently used releases exactly the hold whose turn is next


def test_claim_ages_count_from_a_holds_first_live_claim_until_its_last_is_dropped() -> None:
    clock = Clock()
    holds = Holds(clock=clock)
    for hold in ("a", "b", "c"):
        holds.add(hold)
    holds.claim(["a"])
    clock.now = 1.0
    holds.claim(["b"])
    holds.claim(["a"])  # a second claim on a: its age still counts from the first
    clock.now = 3.0
    assert holds.claim_ages() == [3.0, 2.0]
    holds.release_claim(["a"])
    assert holds.claim_ages() == [3.0, 2.0]  # one claim of a's is left
    holds.release_claim(["a"])
    assert holds.claim_ages() == [2.0]
    holds.claim(["a"])
    assert holds.claim_ages() == [2.0, 0.0]  # claimed anew
