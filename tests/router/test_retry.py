"""Reuse failing never fails the client: the turn is retried as plain P/D."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest

from pdx_router.ids import of_list
from pdx_router.policy import Outcome
from pdx_router.policy.retry import Attempt, Hop, after_failure, first_attempt
from pdx_router.policy.reuse import TurnPlan
from pdx_router.policy.shapes import FRESH_PREFILL_KV

from .conftest import Stack, StackFactory
from .helpers import LONG, assistant, chat, stream_text, user

HIT = TurnPlan(
    Outcome.HIT, reused_tokens=40, kv={"remote_num_tokens": 40}, compared_ids=of_list([1, 2]), affinity="http://d0"
)
MISS = TurnPlan(Outcome.MISS)

# (plan, failed hop, its HTTP status or None when unreachable) -> the retry's outcome, or None: passed on
RETRIES: list[tuple[TurnPlan, Hop, int | None, Outcome | None]] = [
    (HIT, Hop.PREFILL, 500, Outcome.DECLINED),  # the read of decode's blocks was refused
    (HIT, Hop.PREFILL, None, Outcome.DECLINED),
    (MISS, Hop.PREFILL, None, Outcome.MISS),  # another prefill, same outcome
    (MISS, Hop.PREFILL, 500, None),  # the engine's answer to the request itself
    (HIT, Hop.DECODE, None, Outcome.EXPIRED),  # decode went away with the blocks
    (MISS, Hop.DECODE, None, Outcome.MISS),
    (HIT, Hop.DECODE, 500, None),
    (MISS, Hop.DECODE, 503, None),
]


@pytest.mark.parametrize(("plan", "hop", "status", "outcome"), RETRIES)
def test_which_failure_retries_as_plain_pd_and_with_what_outcome(
    plan: TurnPlan, hop: Hop, status: int | None, outcome: Outcome | None
) -> None:
    again = after_failure(first_attempt(plan), hop, status)
    if outcome is None:
        assert again is None
        return
    assert again is not None
    assert again.attempt.outcome is outcome and again.attempt.retried
    assert not again.attempt.reuse and again.attempt.kv is None and again.attempt.compared_ids is None
    assert again.attempt.reused_tokens == 0
    assert again.unreachable is (status is None)


def test_a_retry_is_never_retried() -> None:
    again = after_failure(first_attempt(HIT), Hop.PREFILL, 500)
    assert again is not None
    for hop in Hop:
        assert after_failure(again.attempt, hop, None) is None


def test_only_a_decode_that_went_away_loses_the_affinity() -> None:
    declined = after_failure(first_attempt(HIT), Hop.PREFILL, 500)
    assert declined is not None and declined.attempt.affinity == "http://d0"
    gone = after_failure(first_attempt(HIT), Hop.DECODE, None)
    assert gone is not None and gone.attempt.affinity is None


def test_the_first_attempt_reuses_exactly_when_the_plan_is_a_hit() -> None:
    hit: Attempt = first_attempt(HIT)
    assert hit.reuse and hit.kv == HIT.kv and hit.compared_ids == of_list([1, 2]) and hit.reused_tokens == 40
    miss = first_attempt(MISS)
    assert not miss.reuse and miss.kv is None and miss.outcome is Outcome.MISS


async def two_turns(s: Stack, http: aiohttp.ClientSession, **kw: Any) -> tuple[int, dict[str, str], Any]:
    msgs = [user(LONG)]
    _, _, data = await chat(http, s.url, msgs, **kw)
    text = stream_text(data).strip() if kw.get("stream") else data["choices"][0]["message"]["content"]
    msgs += [assistant(text), user("next")]
    return await chat(http, s.url, msgs, **kw)


async def test_declined_read_is_retried_without_reuse(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack(prefill_opts={"fail_reads": True})
    status, headers, data = await two_turns(s, http)
    assert status == 200 and data["choices"][0]["message"]["content"]
    assert headers["X-PDX-Reuse"] == "declined"
    assert headers["X-PDX-Reused-Tokens"] == "0"
    kvs = [b["kv_transfer_params"] for p, b in s.prefill.requests if p != "/tokenize"]
    assert kvs[-2]["remote_engine_id"] == "decode-0"  # the attempt with reuse
    assert kvs[-1] == FRESH_PREFILL_KV  # the retry
    stats = await (await http.get(s.url + "/v1/pdx/stats")).json()
    assert stats["reuse"]["declined"] == 1


async def test_streamed_declined_read_still_streams(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack(prefill_opts={"fail_reads": True})
    status, headers, lines = await two_turns(s, http, stream=True)
    assert status == 200 and lines[-1] == b"data: [DONE]"
    assert headers["X-PDX-Reuse"] == "declined"


async def test_entry_past_router_deadline_is_not_attached(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(conversation_ttl_seconds=0.2)
    msgs = [user(LONG)]
    _, _, data = await chat(http, s.url, msgs)
    time.sleep(0.3)
    msgs += [assistant(data["choices"][0]["message"]["content"]), user("next")]
    status, headers, _ = await chat(http, s.url, msgs)
    assert status == 200 and headers["X-PDX-Reuse"] == "expired"
    assert s.prefill.requests[-1][1]["kv_transfer_params"] == FRESH_PREFILL_KV


async def test_decode_gone_means_no_reuse_and_other_decode(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(n_decode=2)
    msgs = [user(LONG)]
    _, _, data = await chat(http, s.url, msgs)
    holder = next(d for d in s.decodes if d.requests)
    idx = s.decodes.index(holder)
    await s.runners[1 + idx].cleanup()  # runners: prefill, decode-0, decode-1
    msgs += [assistant(data["choices"][0]["message"]["content"]), user("next")]
    status, headers, data2 = await chat(http, s.url, msgs)
    assert status == 200 and data2["choices"][0]["message"]["content"]
    assert headers["X-PDX-Reuse"] == "expired"
    assert s.decodes[1 - idx].requests


async def test_prefill_engine_errors_reach_the_client_as_502(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack()
    # A chat without messages is the router's own 400 now (tests/faults/test_malformed.py);
    # the fake prefill fails on a completion without a prompt: 5xx -> 502 to the client.
    async with http.post(s.url + "/v1/completions", json={"model": "Qwen"}) as r:
        assert r.status == 502
