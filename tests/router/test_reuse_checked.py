"""Reuse decisions when the engines check the prefix: what is kept, planned and reported."""

from __future__ import annotations

from typing import Any

from pdx_contract import kv_prefix
from pdx_router.entries import Captured, Entry
from pdx_router.policy import Outcome
from pdx_router.policy.retry import after_prefill, first_attempt
from pdx_router.policy.reuse import (
    TurnPlan,
    after_turn,
    check_entry,
    checked_outcome,
    make_held_entry,
    plan_checked_by_engines,
)

from .helpers import ep

DECODE = ep("decode", "http://d0")


def decode_kv(**changes: Any) -> dict[str, Any]:
    kv = {
        "do_remote_prefill": False,
        "do_remote_decode": True,
        "remote_block_ids": [[1, 2, 3]],
        "remote_engine_id": "decode-0",
        "remote_request_id": "r",
        "remote_host": "10.0.0.2",
        "remote_port": 5700,
        "remote_num_tokens": 0,
        "remote_blocks_expiry_time": 9.0,
        kv_prefix.HELD: kv_prefix.held_prefix(list(range(40)), 40, 16).to_json(),
    }
    return {**kv, **changes}


def test_a_turn_whose_decode_named_what_it_holds_keeps_its_params_and_no_ids() -> None:
    kept = after_turn(Captured(kv=decode_kv(), choices=1), None, DECODE, 1.0, 60.0)
    assert kept.entry is not None and not kept.mismatch
    e = kept.entry
    assert e.held_by_engines and e.num_tokens == 40 and e.token_ids == b"" and e.block_size == 16
    assert e.kv == decode_kv() and e.deadline == 61.0
    assert Entry.from_bytes(e.to_bytes()) == e  # as Redis holds it


def test_what_cannot_be_reused_is_not_kept() -> None:
    assert make_held_entry(decode_kv(remote_blocks_expiry_time=None), DECODE, 1.0, 60.0) is None  # not held
    assert make_held_entry(decode_kv(remote_block_ids=[]), DECODE, 1.0, 60.0) is None
    assert make_held_entry(decode_kv(**{kv_prefix.HELD: {"numTokens": 0}}), DECODE, 1.0, 60.0) is None


def test_the_plan_sends_decodes_params_as_they_came_and_leaves_the_entry_intact() -> None:
    e = make_held_entry(decode_kv(), DECODE, 1.0, 60.0)
    assert e is not None
    assert check_entry(e, 2.0, [DECODE], "g1") is None  # live: worth sending to prefill
    plan = plan_checked_by_engines(e)
    assert plan.outcome is Outcome.HIT and plan.checked_by_engines and plan.affinity == "http://d0"
    assert plan.kv == {**decode_kv(), "do_remote_decode": True, "do_remote_prefill": False}
    assert plan.compared_ids is None and e.kv == decode_kv()


def test_the_outcome_is_what_prefill_found_and_nothing_when_it_did_not_say() -> None:
    hit = {kv_prefix.VERDICT: {"outcome": "hit", "tokens": 32}}
    assert checked_outcome(hit) == (Outcome.HIT, 32)
    assert checked_outcome({kv_prefix.VERDICT: {"outcome": "below_threshold", "tokens": 0}}) == (
        Outcome.BELOW_THRESHOLD,
        0,
    )
    assert checked_outcome({}) == (Outcome.PREFIX_MISMATCH, 0)  # a prefill without the check read nothing
    assert checked_outcome({kv_prefix.VERDICT: {"outcome": "hit", "tokens": "32"}}) == (Outcome.PREFIX_MISMATCH, 0)
    assert checked_outcome(None) == (Outcome.PREFIX_MISMATCH, 0)


def test_an_attempt_takes_prefills_word_only_when_the_engines_check() -> None:
    e = make_held_entry(decode_kv(), DECODE, 1.0, 60.0)
    assert e is not None
    attempt = first_attempt(plan_checked_by_engines(e))
    assert attempt.reuse and attempt.reused_tokens == 40  # at most what decode holds, until prefill says
    found = after_prefill(attempt, {kv_prefix.VERDICT: {"outcome": "hit", "tokens": 32}})
    assert found.outcome is Outcome.HIT and found.reused_tokens == 32
    missed = after_prefill(attempt, {kv_prefix.VERDICT: {"outcome": "prefix_mismatch", "tokens": 0}})
    assert missed.outcome is Outcome.PREFIX_MISMATCH and not missed.reuse and missed.reused_tokens == 0
    plain = first_attempt(TurnPlan(Outcome.MISS))
    assert after_prefill(plain, {kv_prefix.VERDICT: {"outcome": "hit", "tokens": 32}}) == plain
