"""The decode-local decision (policy/local.py) and what it reads: the history's positions, the
engines' load, the fallback's attempt."""

from __future__ import annotations

import random
from typing import Any

import pytest

from pdx.local.localmodel import build_local_model
from pdx_router.chat_tokens import ChatTokenizer
from pdx_router.entries import Entry
from pdx_router.ids import of_list
from pdx_router.policy import Outcome, history, local, retry
from pdx_router.policy.local import Rule, Why
from pdx_router.policy.reuse import TurnPlan
from pdx_router.upstream import load_from_metrics

from .helpers import assistant, ep, user

HOLDER = "http://d0"
PLAN = TurnPlan(Outcome.HIT, reused_tokens=4000, kv={}, affinity=HOLDER, checked_by_engines=True)
RULE = Rule(max_tokens=512, max_busy=2)
# A plan that names decode's hold, as a stored turn's parameters do.
HELD = TurnPlan(
    Outcome.HIT,
    reused_tokens=4000,
    kv={"do_remote_decode": True, "remote_request_id": "cmpl-d0-7"},
    affinity=HOLDER,
    checked_by_engines=True,
)


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> ChatTokenizer:
    """The local model's tokenizer (Qwen3's)."""
    return ChatTokenizer.from_dir(build_local_model(tmp_path_factory.mktemp("model")))


def released_by(url: str, hold: str, covered: bool = False) -> Any:
    """A decode that said, in an earlier answer, that it released `hold` (`covered`: superseded,
    a younger hold keeps its blocks)."""
    decode = ep("decode", url)
    decode.note_releases([hold], seq=1, covered=[hold] if covered else None)
    return decode


def test_a_short_suffix_on_an_idle_holder_goes_local() -> None:
    assert local.decide(PLAN, 300, ep("decode", HOLDER), RULE) is Why.LOCAL
    assert local.decide(HELD, 300, released_by(HOLDER, "cmpl-d0-other"), RULE) is Why.LOCAL  # another hold's release
    # superseded: the conversation's next turn holds the same blocks, so a retry of that turn
    # still finds its history in decode's prefix cache
    assert local.decide(HELD, 300, released_by(HOLDER, "cmpl-d0-7", covered=True), RULE) is Why.LOCAL


@pytest.mark.parametrize(
    ("plan", "suffix", "holder", "rule", "why"),
    [
        (PLAN, 300, ep("decode", HOLDER), Rule(0, 2), Why.OFF),
        (TurnPlan(Outcome.MISS), 300, ep("decode", HOLDER), RULE, Why.NOT_HELD),
        (TurnPlan(Outcome.PREFIX_MISMATCH, affinity=HOLDER), 300, ep("decode", HOLDER), RULE, Why.NOT_HELD),
        (PLAN, 300, ep("decode", "http://d1"), RULE, Why.HOLDER),
        (PLAN, 300, None, RULE, Why.HOLDER),
        (PLAN, None, ep("decode", HOLDER), RULE, Why.UNKNOWN),
        (PLAN, 513, ep("decode", HOLDER), RULE, Why.LONG),
        (PLAN, 300, ep("decode", HOLDER, load=2), RULE, Why.BUSY),
        (HELD, 300, released_by(HOLDER, "cmpl-d0-7"), RULE, Why.RELEASED),
    ],
    ids=["off", "miss", "mismatch", "other-decode", "no-decode", "unknown", "long", "busy", "released"],
)
def test_a_turn_goes_through_prefill_when(
    plan: TurnPlan, suffix: int | None, holder: Any, rule: Rule, why: Why
) -> None:
    assert local.decide(plan, suffix, holder, rule) is why


IDLE = Rule(max_tokens=512, max_busy=2, idle_max_tokens=8192)


def shortened_by(url: str, hold: str, kept: int, load: int = 0) -> Any:
    """A decode whose note said it shortened `hold` under pressure to its first `kept` tokens."""
    decode = ep("decode", url, load=load)
    decode.note_releases([], seq=0, since=0, kept={hold: kept})
    return decode


def test_a_shortened_hold_goes_local_only_if_the_lost_tail_and_the_suffix_are_few_enough() -> None:
    # 4000 held, 3900 kept: 100 lost + 300 new = 400 <= 512, decode computes them
    assert local.decide(HELD, 300, shortened_by(HOLDER, "cmpl-d0-7", 3900), RULE) is Why.LOCAL
    # 1000 lost + 300 new: over the threshold the suffix alone met, through prefill (the claim cuts the read)
    assert local.decide(HELD, 300, shortened_by(HOLDER, "cmpl-d0-7", 3000), RULE) is Why.SHORTENED
    # on an idle decode with the idle bound the tail is computed there, as any long suffix
    assert local.decide(HELD, 300, shortened_by(HOLDER, "cmpl-d0-7", 3000), IDLE) is Why.LOCAL
    assert local.decide(HELD, 300, shortened_by(HOLDER, "cmpl-d0-7", 3000, load=1), IDLE) is Why.SHORTENED
    # a long suffix stays `long`; another hold's shortening is not this turn's
    assert local.decide(HELD, 600, shortened_by(HOLDER, "cmpl-d0-7", 3000), RULE) is Why.LONG
    assert local.decide(HELD, 300, shortened_by(HOLDER, "cmpl-d0-other", 10), RULE) is Why.LOCAL


def test_a_long_suffix_goes_local_only_while_its_decode_has_nothing_in_flight() -> None:
    assert local.decide(PLAN, 2000, ep("decode", HOLDER), IDLE) is Why.LOCAL
    assert local.decide(PLAN, 8192, ep("decode", HOLDER), IDLE) is Why.LOCAL
    assert local.decide(PLAN, 2000, ep("decode", HOLDER, load=1), IDLE) is Why.LONG
    assert local.decide(PLAN, 8193, ep("decode", HOLDER), IDLE) is Why.LONG
    other_routers = ep("decode", HOLDER)
    other_routers.others_load = 1
    assert local.decide(PLAN, 2000, other_routers, IDLE) is Why.LONG


def test_a_fresh_look_is_taken_only_when_a_stale_scrape_of_others_load_alone_keeps_a_long_suffix_off() -> None:
    holder = ep("decode", HOLDER)
    holder.others_load, holder.load_seen = 1, 100.0
    later = 100.0 + local.FRESH_S + 0.01
    assert local.worth_a_fresh_look(2000, holder, IDLE, later)
    assert not local.worth_a_fresh_look(2000, holder, IDLE, 100.0 + local.FRESH_S / 2)  # scraped just now
    assert not local.worth_a_fresh_look(400, holder, IDLE, later)  # short: busy's own bound decides
    assert not local.worth_a_fresh_look(8193, holder, IDLE, later)  # too long even for an idle decode
    assert not local.worth_a_fresh_look(None, holder, IDLE, later)
    ours = ep("decode", HOLDER, load=1)  # this router's own turn is there now: no look changes that
    ours.others_load = 1
    assert not local.worth_a_fresh_look(2000, ours, IDLE, later)
    holder.others_load = 0
    assert not local.worth_a_fresh_look(2000, holder, IDLE, later)  # idle already: local as it is


def test_the_idle_bound_is_off_with_decode_local_and_below_the_busy_one() -> None:
    assert local.decide(PLAN, 300, ep("decode", HOLDER), Rule(0, 2, 8192)) is Why.OFF
    assert Rule(0, 2, 8192).cap == 0
    assert local.decide(PLAN, 400, ep("decode", HOLDER, load=1), Rule(512, 2, 100)) is Why.LOCAL
    assert (IDLE.cap, Rule(512, 2, 100).cap) == (8192, 512)


def test_other_replicas_turns_count_as_busy_beside_this_routers_own() -> None:
    holder = ep("decode", HOLDER, load=1)
    holder.others_load = 4  # other router replicas' turns
    assert local.busy(holder) == 5
    assert local.decide(PLAN, 10, holder, RULE) is Why.BUSY


def test_a_scrape_that_finds_this_routers_own_turn_leaves_no_other_load() -> None:
    assert local.others_load(1, own=1) == 0
    assert local.others_load(3, own=1) == 2
    assert local.others_load(0, own=1) == 0  # our turn ended before the engine was asked
    assert local.others_load(None, own=0) is None


def test_the_suffix_is_the_messages_after_the_stored_turns_answer() -> None:
    stored = [user("a"), assistant("b"), user("c")]
    answer = assistant("d")
    turn = history.of_messages(stored).turn(answer)
    request = [*stored, answer, user("new"), assistant("x"), user("newer")]
    tail = local.suffix_messages(request, history.of_messages(request), turn)
    assert tail == [user("new"), assistant("x"), user("newer")]


def test_an_edited_or_unknown_turn_has_no_suffix() -> None:
    stored = [user("a")]
    turn = history.of_messages(stored).turn(assistant("d"))
    edited = [user("a, edited"), assistant("d"), user("new")]
    assert local.suffix_messages(edited, history.of_messages(edited), turn) is None
    assert local.suffix_messages(edited, history.of_messages(edited), None) is None
    assert local.suffix_messages(edited, None, turn) is None


def test_the_estimate_counts_bytes_and_template_markers() -> None:
    msgs = [user("x" * 400)]
    n = local.estimate_tokens(msgs)
    assert 100 < n < 100 + 3 * local.MESSAGE_TOKENS + 10  # ~4 bytes a token, plus markers


def test_a_tokenizer_counts_short_suffixes_and_long_ones_are_not_tokenized() -> None:
    seen: list[str] = []

    def count(text: str) -> int:
        seen.append(text)
        return 7

    assert local.count_tokens([user("hello")], count, cap=512) == 7 + 2 * local.MESSAGE_TOKENS
    long = [user("y" * 8000)]
    assert local.count_tokens(long, count, cap=512) == local.estimate_tokens(long)
    assert len(seen) == 1


def test_a_suffix_whose_bytes_fit_what_goes_local_is_not_tokenized() -> None:
    seen: list[str] = []

    def count(text: str) -> int:
        seen.append(text)
        return 7

    tail = [user("z" * 1500)]  # ~1.5k bytes: within an idle decode's 8192, not a busy one's 512
    bound = local.upper_bound(tail)
    idle, busy = ep("decode", HOLDER), ep("decode", HOLDER, load=1)
    assert local.sure_local(PLAN, idle, IDLE) == 8192
    assert local.count_tokens(tail, count, IDLE.cap, local.sure_local(PLAN, idle, IDLE)) == bound
    assert seen == []
    assert local.sure_local(PLAN, busy, IDLE) == 512
    counted = local.count_tokens(tail, count, IDLE.cap, local.sure_local(PLAN, busy, IDLE))
    assert counted == 7 + 2 * local.MESSAGE_TOKENS
    assert len(seen) == 1
    # a shortened hold's lost tail comes off what is sure; no holder, or decode-local off: nothing is
    assert local.sure_local(HELD, shortened_by(HOLDER, "cmpl-d0-7", 3000), IDLE) == 8192 - 1000
    assert local.sure_local(PLAN, None, IDLE) == local.sure_local(PLAN, idle, Rule(0, 2, 8192)) == 0


@pytest.mark.parametrize("seed", range(4))
def test_the_bound_decides_every_turn_as_the_tokenizer_s_count_would(seed: int, tok: ChatTokenizer) -> None:
    rng = random.Random(seed)
    words = ["tool", "output:", '{"k": [1, 2]}', "naïve", "数字", "  ", "\n", "x=1;", "<|im_end|>"]
    for _ in range(200):
        tail = [user(" ".join(rng.choice(words) for _ in range(rng.randint(1, 400))))]
        exact = len(tok.encode("".join(history.canonical(m).decode() for m in tail)))
        assert exact + 2 * local.MESSAGE_TOKENS <= local.upper_bound(tail)
        rule = Rule(rng.choice([64, 256, 512]), 2, rng.choice([0, 1024, 4096]))
        holder = shortened_by(HOLDER, "cmpl-d0-7", rng.choice([4000, 3900, 3000]), load=rng.choice([0, 0, 1, 2]))
        counted = local.count_tokens(tail, tok.count, rule.cap)
        fast = local.count_tokens(tail, tok.count, rule.cap, local.sure_local(HELD, holder, rule))
        assert local.decide(HELD, fast, holder, rule) is local.decide(HELD, counted, holder, rule)


def test_the_router_s_own_ids_give_the_exact_suffix() -> None:
    plan = TurnPlan(Outcome.HIT, reused_tokens=90, compared_ids=of_list(list(range(100))), affinity=HOLDER)
    assert local.exact_suffix(plan) == 10
    assert local.exact_suffix(PLAN) is None


def test_a_history_names_where_each_stored_turn_ends() -> None:
    msgs = [user("a"), assistant("b"), user("c"), assistant("d"), user("e")]
    h = history.of_messages(msgs)
    assert h.at == (3, 1)
    assert h.held_through(h.lookup[1]) == 1
    assert h.held_through(b"\0" * 16) is None


def test_a_failed_local_turn_reads_as_planned_or_runs_plainly_when_its_decode_is_gone() -> None:
    attempt = retry.local_attempt(PLAN)
    assert attempt.outcome is Outcome.LOCAL and attempt.kv is None and attempt.reused_tokens == 4000
    answered = retry.after_local_failure(attempt, 500)
    assert (answered.attempt.outcome, answered.attempt.reuse, answered.unreachable) == (Outcome.HIT, True, False)
    assert not answered.attempt.retried  # the D->P path keeps its own retry
    gone = retry.after_local_failure(attempt, None)
    assert (gone.attempt.outcome, gone.attempt.reuse, gone.attempt.affinity) == (Outcome.EXPIRED, False, None)
    assert gone.unreachable and gone.attempt.retried


def test_the_engine_load_is_running_plus_waiting_over_every_engine() -> None:
    text = (
        b"# HELP vllm:num_requests_running x\n"
        b'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        b'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
        b'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
        b'vllm:num_requests_waiting_by_reason{engine="0",reason="x"} 9.0\n'
    )
    assert load_from_metrics(text) == 6
    assert load_from_metrics(b"other_metric 1\n") is None


def test_an_entry_keeps_its_turn_through_the_store_form() -> None:
    e = Entry(
        kv={"remote_block_ids": [[1]]},
        token_ids=of_list([1, 2]),
        decode_url=HOLDER,
        generation="g",
        stored_at=1.0,
        deadline=2.0,
        turn=b"\x01" * 16,
    )
    assert Entry.from_bytes(e.to_bytes()).turn == b"\x01" * 16
    plain = Entry(kv=e.kv, token_ids=e.token_ids, decode_url=HOLDER, generation="g", stored_at=1.0, deadline=2.0)
    assert Entry.from_bytes(plain.to_bytes()).turn is None
