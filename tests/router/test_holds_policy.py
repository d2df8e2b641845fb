"""Claims on decode's held KV (policy/holds.py): a turn reads only a hold decode has pinned."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdx_contract import kv_prefix
from pdx_contract.holds import RELEASED_KV
from pdx_router.endpoints import KNOWN_RELEASES
from pdx_router.policy import Outcome, holds, retry
from pdx_router.policy.holds import Claim
from pdx_router.policy.reuse import TurnPlan

from .helpers import ep

KV = {"do_remote_decode": True, "do_remote_prefill": False, "remote_request_id": "cmpl-7", "remote_block_ids": [[1]]}
PLAN = TurnPlan(Outcome.HIT, reused_tokens=300, kv=KV, affinity="http://d0", checked_by_engines=True)


def test_a_reading_turn_claims_decodes_request_id() -> None:
    assert holds.hold_id(KV) == "cmpl-7"


@pytest.mark.parametrize(
    "kv",
    [None, {}, {**KV, "do_remote_decode": False}, {**KV, "remote_request_id": ""}, {**KV, "remote_request_id": 7}],
    ids=["fresh", "empty", "not-a-read", "blank-id", "number-id"],
)
def test_a_turn_that_reads_nothing_claims_nothing(kv: dict[str, object] | None) -> None:
    assert holds.hold_id(kv) is None


def _answer(held: list[str], valve: bool = True) -> dict[str, object]:
    return {"held": held, "heldBlocks": 3, "capacityBlocks": 32, "releases": 1, "valve": valve}


def test_decodes_answer_names_the_holds_it_pinned() -> None:
    assert holds.read_answer("cmpl-7", 200, _answer(["cmpl-1", "cmpl-7"])) is Claim.HELD
    assert holds.read_answer("cmpl-7", 200, _answer(["cmpl-1"])) is Claim.GONE


def test_a_newer_decodes_extra_fields_do_not_turn_its_answers_into_failures() -> None:
    newer = {**_answer(["cmpl-7"]), "covered": [], "someFigureOfLater": 3}
    assert holds.read_answer("cmpl-7", 200, newer) is Claim.HELD
    note = {"since": 0, "seq": 2, "released": ["cmpl-1", "cmpl-2"], "covered": ["cmpl-2"], "later": True}
    kv = {**KV, RELEASED_KV: note}
    got = holds.released_note(kv)
    assert got is not None and (got.released, got.covered) == (["cmpl-1", "cmpl-2"], ["cmpl-2"])
    assert RELEASED_KV not in kv  # taken out: it is for the router, not for the next prefill


@pytest.mark.parametrize(
    ("status", "body", "claim"),
    [
        (404, None, Claim.NO_VALVE),
        (405, None, Claim.NO_VALVE),
        (200, _answer([], valve=False), Claim.NO_VALVE),
        (0, None, Claim.UNREACHABLE),
        (500, None, Claim.FAILED),
        (400, {"error": "claim: ..."}, Claim.FAILED),
        (200, {"held": "cmpl-7"}, Claim.FAILED),
        (200, [], Claim.FAILED),
    ],
    ids=["no-route", "no-method", "valve-off", "no-answer", "engine-error", "refused", "wrong-shape", "not-an-object"],
)
def test_an_answer_other_than_a_grant_or_a_release_reads_as_no_valve_or_a_failure(
    status: int, body: object, claim: Claim
) -> None:
    assert holds.read_answer("cmpl-7", status, body) is claim


def test_the_holder_is_found_by_url_even_while_it_drains() -> None:
    draining = ep("decode", "http://d0")
    draining.draining = True
    pool = [ep("prefill", "http://d0"), ep("decode", "http://d1"), draining]
    assert holds.holder(pool, "http://d0") is draining
    assert holds.holder(pool, "http://d9") is None and holds.holder(pool, None) is None


@pytest.mark.parametrize("claim", [Claim.HELD, Claim.NO_VALVE])
def test_a_pinned_hold_or_one_that_cannot_be_released_is_read(claim: Claim) -> None:
    first = retry.first_attempt(PLAN)
    assert holds.after_claim(first, claim) == first


@pytest.mark.parametrize("claim", [Claim.GONE, Claim.FAILED])
def test_a_released_or_unconfirmed_hold_is_not_read_and_the_turn_says_released(claim: Claim) -> None:
    after = holds.after_claim(retry.first_attempt(PLAN), claim)
    assert after.outcome is Outcome.RELEASED and not after.reuse and after.kv is None
    assert after.affinity == "http://d0"  # the decode is healthy: its prefix cache may still help
    assert not after.retried  # a prefill failure later still gets its one retry


def test_an_unreachable_holder_means_the_kv_went_with_it_and_another_decode_takes_the_turn() -> None:
    after = holds.after_claim(retry.first_attempt(PLAN), Claim.UNREACHABLE)
    assert after.outcome is Outcome.EXPIRED and not after.reuse and after.affinity is None


def test_a_decodes_known_releases_are_bounded_oldest_first() -> None:
    decode = ep("decode", "http://d0")
    decode.note_releases([f"cmpl-{i}" for i in range(KNOWN_RELEASES + 10)], KNOWN_RELEASES + 10)
    assert len(decode.released) == KNOWN_RELEASES and decode.released_seq == KNOWN_RELEASES + 10
    assert not holds.known_released(decode, "cmpl-0") and holds.known_released(decode, f"cmpl-{KNOWN_RELEASES + 9}")


def test_a_note_names_the_holds_decode_shortened_and_what_each_still_keeps() -> None:
    note = holds.released_note({**KV, RELEASED_KV: {"since": 0, "seq": 0, "kept": {"cmpl-3": 256}}})
    assert note is not None and note.kept == {"cmpl-3": 256}
    decode = ep("decode", "http://d0")
    decode.note_releases(note.released, note.seq, note.since, note.covered, note.kept)
    assert holds.tokens_given_up(decode, "cmpl-3", 1000) == 744  # of a plan reading 1000 tokens
    assert holds.tokens_given_up(decode, "cmpl-3", 200) == 0  # the read ends inside what is kept
    assert holds.tokens_given_up(decode, "cmpl-4", 1000) == 0 and holds.tokens_given_up(decode, None, 1000) == 0
    decode.note_releases([], 0, 0, None, {f"cmpl-{i}": 1 for i in range(KNOWN_RELEASES + 1)})
    assert len(decode.kept) == KNOWN_RELEASES and "cmpl-0" not in decode.kept  # bounded, oldest out


# ---------------------------------------------------------------- a hold decode shortened


def _held_kv(tokens: int, block_size: int = 16) -> dict[str, object]:
    ids = list(range(tokens))
    held = kv_prefix.held_prefix(ids, tokens, block_size).to_json()
    blocks = [list(range(100, 100 + -(-tokens // block_size)))]
    return {**KV, "remote_block_ids": blocks, "remote_num_tokens": 0, kv_prefix.HELD: held}


def test_a_held_prefix_is_cut_to_the_blocks_decode_kept_and_still_verifies() -> None:
    kv = _held_kv(100)  # 7 blocks, the last partial
    cut = holds.cut_to_kept(kv, 48)
    assert cut is not None and cut["remote_block_ids"] == [[100, 101, 102]]
    held = kv_prefix.HeldPrefix.model_validate(cut[kv_prefix.HELD])
    chain = held.chain()
    assert held.num_tokens == 48 and chain is not None
    assert kv_prefix.verified_tokens(held, chain, list(range(200))) == 48  # the kept prefix still matches
    assert kv[kv_prefix.HELD]["numTokens"] == 100  # type: ignore[index]  # the entry's copy is intact


def test_parameters_the_router_checks_are_cut_by_tokens_and_blocks() -> None:
    kv = {**KV, "remote_block_ids": [[5, 6, 7, 8, 9, 10, 11]], "remote_num_tokens": 100}
    assert holds.cut_to_kept(kv, 48) == {**kv, "remote_block_ids": [[5, 6, 7]], "remote_num_tokens": 48}
    assert holds.cut_to_kept(kv, 112) == kv  # decode kept all of it


@pytest.mark.parametrize(
    "kv",
    [
        {**KV, "remote_block_ids": [[1, 2], [3, 4]], "remote_num_tokens": 32},  # a hybrid model's two groups
        {**KV, "remote_block_ids": [[1, 2]], "remote_num_tokens": 2},  # 2 tokens in 2 blocks: size 1 or 2
        {**KV, "remote_block_ids": [[1, 2, 3]], "remote_num_tokens": 0},
        {**KV, "remote_block_ids": [[1]], kv_prefix.HELD: {"numTokens": 16, "blockSize": 16, "digests": "??"}},
    ],
    ids=["hybrid", "unknown-block-size", "no-tokens", "bad-digests"],
)
def test_a_hold_that_cannot_be_cut_safely_is_not_read(kv: dict[str, object]) -> None:
    assert holds.cut_to_kept(kv, 1) is None
    after = holds.after_claim(retry.first_attempt(replace(PLAN, kv=kv)), Claim.HELD, 1)
    assert after.outcome is Outcome.RELEASED and after.kv is None


def test_a_shortened_hold_is_read_only_up_to_its_kept_tokens() -> None:
    plan = TurnPlan(Outcome.HIT, reused_tokens=100, kv=_held_kv(100), affinity="http://d0", checked_by_engines=True)
    after = holds.after_claim(retry.first_attempt(plan), Claim.HELD, 32)
    assert after.reuse and after.outcome is Outcome.HIT and after.plan.reused_tokens == 32
    assert after.kv is not None and after.kv["remote_block_ids"] == [[100, 101]]
    assert holds.after_claim(retry.first_attempt(plan), Claim.HELD, 0).outcome is Outcome.RELEASED


# ---------------------------------------------------------------- a leased claim


def test_a_leased_claims_read_must_start_before_the_lease_ends() -> None:
    plan = replace(PLAN, kv={**KV, "remote_blocks_expiry_time": 900.0})
    after = holds.after_claim(retry.first_attempt(plan), Claim.HELD, expiry=530.0)
    assert after.reuse and after.outcome is Outcome.HIT and after.plan.reused_tokens == 300
    assert after.kv is not None and after.kv["remote_blocks_expiry_time"] == 530.0
    assert plan.kv is not None and plan.kv["remote_blocks_expiry_time"] == 900.0  # the entry's copy is intact


def test_a_lease_never_extends_the_holds_own_deadline() -> None:
    kv = {**KV, "remote_blocks_expiry_time": 500.0}
    assert holds.cap_expiry(kv, 530.0) == kv
    assert holds.cap_expiry({**KV, "remote_blocks_expiry_time": None}, 530.0)["remote_blocks_expiry_time"] == 530.0


def test_a_shortened_and_leased_hold_is_cut_and_capped() -> None:
    plan = TurnPlan(Outcome.HIT, reused_tokens=100, kv=_held_kv(100), affinity="http://d0", checked_by_engines=True)
    after = holds.after_claim(retry.first_attempt(plan), Claim.HELD, 32, expiry=75.0)
    assert after.kv is not None and after.kv["remote_block_ids"] == [[100, 101]]
    assert after.kv["remote_blocks_expiry_time"] == 75.0 and after.plan.reused_tokens == 32
