"""Reuse: whether a turn reads decode's KV, how many tokens, and what is kept for the next."""

from __future__ import annotations

from pdx_router.entries import Captured
from pdx_router.ids import common_prefix, to_list
from pdx_router.ids import of_list as T
from pdx_router.policy import Outcome
from pdx_router.policy.reuse import (
    IdsSource,
    PromptIds,
    after_turn,
    check_entry,
    cut_block_ids,
    make_entry,
    no_reuse,
    plan_reuse,
    plan_turn,
    prompt_ids_agree,
)
from pdx_router.tokens import infer_block_size

from .helpers import entry, ep


def test_exact_extension_reuses_everything_decode_holds() -> None:
    held = list(range(100, 140))
    plan = plan_reuse(entry(held, 10), T([*held, 7, 8, 9]), threshold=8)
    assert plan.outcome is Outcome.HIT and plan.tokens == 40
    assert plan.kv is not None and plan.kv["remote_num_tokens"] == 40
    assert plan.kv["remote_block_ids"] == [list(range(10, 20))]


def test_edited_history_lowers_tokens_and_cuts_blocks() -> None:
    held = list(range(100, 140))
    prompt = [*held[:21], 1, 2, 3, *held[24:], 5]
    plan = plan_reuse(entry(held, 10), T(prompt), threshold=8)
    assert plan.outcome is Outcome.HIT and plan.tokens == 21
    assert plan.kv is not None and plan.kv["remote_num_tokens"] == 21
    # 21 tokens at block size 4 live in the first 6 blocks; the list must end there
    assert plan.kv["remote_block_ids"] == [[10, 11, 12, 13, 14, 15]]


def test_truncated_history_reuses_only_the_kept_prefix() -> None:
    held = list(range(100, 140))
    plan = plan_reuse(entry(held, 10), T(held[:30]), threshold=8)
    assert plan.tokens == 29  # the last prompt token is always computed by prefill
    assert plan.kv is not None and plan.kv["remote_block_ids"] == [list(range(10, 18))]


def test_edit_near_the_start_skips_reuse_as_prefix_mismatch() -> None:
    held = list(range(100, 140))
    plan = plan_reuse(entry(held, 10), T([1, *held[1:], 3]), threshold=8)
    assert plan.outcome is Outcome.PREFIX_MISMATCH and plan.kv is None


def test_short_conversation_is_below_threshold() -> None:
    held = list(range(100, 105))
    plan = plan_reuse(entry(held, 2), T([*held, 1, 2]), threshold=8)
    assert plan.outcome is Outcome.BELOW_THRESHOLD and plan.kv is None


def test_unknown_block_size_refuses_to_cut() -> None:
    held = list(range(100, 140))
    plan = plan_reuse(entry(held, 3, block_size=None), T(held[:30]), threshold=8)
    # 40 tokens in 3 blocks fits block sizes 16 only -> inferable; 30 tokens -> 2 blocks
    assert plan.kv is not None and plan.kv["remote_block_ids"] == [[10, 11]]
    ambiguous = plan_reuse(entry(held[:10], 1, block_size=None), T([*held[:9], 0]), threshold=2)
    assert ambiguous.outcome is Outcome.PREFIX_MISMATCH


def test_entry_checks_deadline_holder_and_generation() -> None:
    eps = [ep("decode", "http://d0")]
    e = entry(list(range(20)), 5, deadline=100.0)
    assert check_entry(None, 0, eps, "g1") is Outcome.MISS
    assert check_entry(e, 50, eps, "g1") is None
    assert check_entry(e, 100, eps, "g1") is Outcome.EXPIRED
    assert check_entry(e, 50, eps, "g2") is Outcome.EXPIRED
    eps[0].healthy = False
    assert check_entry(e, 50, eps, "g1") is Outcome.EXPIRED


def test_entry_holds_exactly_remote_num_tokens_ids() -> None:
    kv = {"remote_num_tokens": 6, "remote_block_ids": [[1, 2]], "remote_blocks_expiry_time": 5.0}
    e = make_entry(kv, T([1, 2, 3, 4]), [5, 6, 7], ep("decode", "d"), 10.0, 450.0)
    assert e is not None and to_list(e.token_ids) == [1, 2, 3, 4, 5, 6] and e.deadline == 460.0
    assert make_entry({**kv, "remote_blocks_expiry_time": None}, T([1]), [2], ep("decode", "d"), 0, 1) is None
    assert make_entry({**kv, "remote_num_tokens": 9}, T([1, 2]), [3], ep("decode", "d"), 0, 1) is None


def test_prefix_helpers() -> None:
    a = list(range(1000))
    b = [*a[:700], 7000, *a[701:]]
    assert common_prefix(T(a), T(b)) == 700
    assert common_prefix(T(a), T(a[:5])) == 5 and common_prefix(T(a[:5]), T(a)) == 5
    assert common_prefix(T([]), T(a)) == 0
    assert common_prefix(T([12, 34]), T([12, 345])) == 1 and common_prefix(T([12, 345]), T([12, 34, 5])) == 1
    assert cut_block_ids([[1, 2, 3], [4, 5, 6]], 2) == [[1, 2], [4, 5]]
    assert infer_block_size(307, 20) == 16


def test_prompt_ids_agree_only_when_equal_or_unknown() -> None:
    assert prompt_ids_agree(T([1, 2, 3]), T([1, 2, 3]))
    assert not prompt_ids_agree(T([1, 2, 3]), T([1, 3, 2]))
    assert not prompt_ids_agree(T([1, 2]), T([1, 2, 3]))
    assert prompt_ids_agree(None, T([1, 2]))  # no reuse planned: nothing to compare
    assert prompt_ids_agree(T([1, 2]), None)  # decode's ids not asked for


def test_a_hit_plan_keeps_the_compared_ids_their_source_and_the_holder() -> None:
    held = list(range(100, 140))
    plan = plan_turn(entry(held, 10), PromptIds(T([*held, 7]), IdsSource.LOCAL, "text"), threshold=8)
    assert plan.outcome is Outcome.HIT and plan.reused_tokens == 40
    assert plan.compared_ids == T([*held, 7]) and plan.local_ids and plan.text == "text"
    assert plan.affinity == "http://d0" and plan.kv is not None and plan.kv["remote_num_tokens"] == 40


def test_a_plan_without_reuse_compares_no_ids_but_still_prefers_the_holder() -> None:
    held = list(range(100, 140))
    below = plan_turn(entry(held, 10), PromptIds(T(held[:3]), IdsSource.ENGINE), threshold=8)
    assert below.outcome is Outcome.BELOW_THRESHOLD and below.compared_ids is None and below.kv is None
    assert below.reused_tokens == 0 and below.affinity == "http://d0"
    untokenized = plan_turn(entry(held, 10), PromptIds(None, None, "text"), threshold=8)
    assert untokenized.outcome is Outcome.PREFIX_MISMATCH and untokenized.text == "text"
    expired = no_reuse(entry(held, 10), Outcome.EXPIRED)
    assert expired.outcome is Outcome.EXPIRED and expired.affinity == "http://d0"
    assert no_reuse(None, Outcome.MISS).affinity is None


def _decode_answer(prompt: list[int], output: list[int], choices: int = 1) -> Captured:
    kv = {"remote_num_tokens": 6, "remote_block_ids": [[1, 2]], "remote_blocks_expiry_time": 5.0}
    return Captured(prompt_ids=T(prompt), output_ids=output, kv=kv, choices=choices)


def test_a_turn_decode_ran_on_the_compared_ids_is_kept() -> None:
    kept = after_turn(_decode_answer([1, 2, 3, 4], [5, 6, 7]), T([1, 2, 3, 4]), ep("decode", "d"), 10.0, 450.0)
    assert not kept.mismatch and kept.entry is not None and to_list(kept.entry.token_ids) == [1, 2, 3, 4, 5, 6]
    unplanned = after_turn(_decode_answer([1, 2, 3, 4], [5, 6, 7]), None, ep("decode", "d"), 10.0, 450.0)
    assert unplanned.entry is not None  # no reuse this turn: nothing to hold against it


def test_a_turn_decode_ran_on_other_ids_keeps_nothing_and_says_so() -> None:
    kept = after_turn(_decode_answer([1, 2, 9, 4], [5, 6, 7]), T([1, 2, 3, 4]), ep("decode", "d"), 10.0, 450.0)
    assert kept.mismatch and kept.entry is None


def test_a_turn_of_several_choices_keeps_nothing() -> None:
    kept = after_turn(_decode_answer([1, 2, 3, 4], [5, 6, 7], choices=2), None, ep("decode", "d"), 10.0, 450.0)
    assert kept.entry is None and not kept.mismatch
