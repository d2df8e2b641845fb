"""A turn that would claim decode's held KV waits for its prefill first (`router.claimQueueTokens`,
pdx_router.claim_gate): queued behind other prefills, its hold stays unclaimed and releasable."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from pdx_router.claim_gate import ClaimGate
from pdx_router.policy import holds

from .conftest import Stack, StackFactory
from .helpers import LONG, assistant, chat, user

P = "http://prefill-0"


async def settled() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_claiming_turn_waits_while_its_prefill_has_more_than_the_budget_in_flight() -> None:
    gate = ClaimGate(budget=1000)
    first = await gate.enter(P, 800, claims=False)
    second = await gate.enter(P, 800, claims=False)
    claimer = asyncio.create_task(gate.enter(P, 50, claims=True))
    await settled()
    assert not claimer.done() and gate.waiting() == 1
    first.leave()  # 800 left: within the budget
    await settled()
    assert claimer.done() and gate.waiting() == 0 and gate.in_flight(P) == 850
    second.leave()
    claimer.result().leave()
    assert gate.in_flight(P) == 0


async def test_a_waiting_turn_whose_hold_was_released_meanwhile_goes_when_the_queue_next_moves() -> None:
    gate = ClaimGate(budget=100)
    busy = [await gate.enter(P, 500, claims=False) for _ in range(3)]
    still = {"claims": True}
    released = asyncio.create_task(gate.enter(P, 10, claims=lambda: still["claims"]))
    behind = asyncio.create_task(gate.enter(P, 10, claims=False))
    await settled()
    assert not released.done() and not behind.done() and gate.waiting() == 2
    still["claims"] = False  # decode's note: the hold is gone, there is nothing to pin
    busy[0].leave()  # 1,000 still in flight: over the budget, yet the queue moves
    await settled()
    assert released.done() and behind.done() and gate.waiting() == 0
    assert gate.in_flight(P) == 1020


async def test_a_waiting_turn_that_still_claims_is_asked_again_and_keeps_waiting() -> None:
    gate = ClaimGate(budget=100)
    busy = [await gate.enter(P, 500, claims=False) for _ in range(2)]
    asked: list[bool] = []

    def claims() -> bool:
        asked.append(True)
        return True

    waiting = asyncio.create_task(gate.enter(P, 10, claims=claims))
    await settled()
    busy[0].leave()
    await settled()
    assert not waiting.done() and len(asked) == 2  # on entry, and when the queue moved
    busy[1].leave()
    await settled()
    assert waiting.done()
    waiting.result().leave()


async def test_many_short_prefills_in_flight_hold_no_claim_back() -> None:
    gate = ClaimGate(budget=1000)
    short = [await gate.enter(P, 60, claims=False) for _ in range(16)]
    claimer = await asyncio.wait_for(gate.enter(P, 20, claims=True), 1)  # 960 ahead: at once
    for slot in [*short, claimer]:
        slot.leave()


async def test_a_turn_that_claims_nothing_passes_unless_a_claiming_turn_waits() -> None:
    gate = ClaimGate(budget=0)
    busy = await gate.enter(P, 500, claims=False)
    fresh = await asyncio.wait_for(gate.enter(P, 500, claims=False), 1)  # nobody waits: at once
    claimer = asyncio.create_task(gate.enter(P, 10, claims=True))
    behind = asyncio.create_task(gate.enter(P, 500, claims=False))
    await settled()
    assert not claimer.done() and not behind.done()  # behind the waiting claim, first come first served
    busy.leave()
    fresh.leave()
    await settled()
    assert claimer.done() and behind.done()  # the claim goes, and the turn behind it with it


async def test_leave_is_idempotent_and_other_prefills_do_not_count() -> None:
    gate = ClaimGate(budget=0)
    slot = await gate.enter(P, 500, claims=False)
    other = await asyncio.wait_for(gate.enter("http://prefill-1", 10, claims=True), 1)
    claimer = asyncio.create_task(gate.enter(P, 10, claims=True))
    await settled()
    slot.leave()
    slot.leave()
    await settled()
    assert gate.in_flight(P) == 10
    claimer.result().leave()
    assert gate.in_flight(P) == 0
    other.leave()


async def test_a_waiting_turn_whose_client_left_lets_the_next_one_go() -> None:
    gate = ClaimGate(budget=0)
    busy = await gate.enter(P, 500, claims=False)
    gone = asyncio.create_task(gate.enter(P, 10, claims=True))
    behind = asyncio.create_task(gate.enter(P, 500, claims=False))
    await settled()
    gone.cancel()
    await settled()
    assert behind.done() and gate.waiting() == 0
    busy.leave()
    behind.result().leave()
    assert gate.in_flight(P) == 0


async def test_an_admitted_turn_whose_client_left_frees_its_place() -> None:
    gate = ClaimGate(budget=0)
    busy = await gate.enter(P, 500, claims=False)
    admitted = asyncio.create_task(gate.enter(P, 10, claims=True))
    await settled()
    busy.leave()  # admits it, but its task has not run yet
    admitted.cancel()
    with pytest.raises(asyncio.CancelledError):
        await admitted
    assert gate.in_flight(P) == 0


# ------------------------------------------------------------ through the router

CHECKS = {"checks_prefix": True}


async def first_turn(http: aiohttp.ClientSession, s: Stack, conversation: str) -> list[dict[str, Any]]:
    msgs = [user(f"{conversation} " + LONG)]
    status, _, data = await chat(http, s.url, msgs, conversation=conversation)
    assert status == 200, data
    return [*msgs, assistant(data["choices"][0]["message"]["content"]), user("next " + LONG)]


@pytest.mark.parametrize(("budget", "claimed_while_queued"), [(0, False), (1 << 30, True)], ids=["gated", "on-arrival"])
async def test_a_reused_turn_queued_behind_a_prefill_claims_its_hold_only_when_it_goes(
    make_stack: StackFactory, http: aiohttp.ClientSession, budget: int, claimed_while_queued: bool
) -> None:
    s = await make_stack(
        prefill_opts={**CHECKS, "prefill_delay": 0.4},
        decode_opts={**CHECKS, "valve": True},
        claim_queue_tokens=budget,
    )
    follow_up = await first_turn(http, s, "a")
    long_one = asyncio.create_task(chat(http, s.url, [user("b " + LONG)], conversation="b"))
    await asyncio.sleep(0.1)  # b's prefill is under way
    reused = asyncio.create_task(chat(http, s.url, follow_up, conversation="a"))
    await asyncio.sleep(0.15)  # a's turn is queued behind b's prefill
    assert (sum(s.cluster.claims.values()) > 0) is claimed_while_queued
    assert (s.router.claim_gate.waiting() == 1) is not claimed_while_queued
    (status_b, _, _), (status_a, headers_a, _) = await asyncio.gather(long_one, reused)
    assert (status_a, status_b, headers_a["X-PDX-Reuse"]) == (200, 200, "hit")
    assert s.router.claim_gate.waiting() == 0


def test_a_turns_prefill_work_is_its_body_in_tokens_less_what_it_reads() -> None:
    assert holds.prefill_tokens(4000, 0) == 1000
    assert holds.prefill_tokens(4000, 900) == 100
    assert holds.prefill_tokens(4000, 5000) == 1  # never nothing: the last token is computed


async def test_a_reused_turn_to_a_decode_without_the_valve_never_waits_for_its_prefill(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(prefill_opts={**CHECKS, "prefill_delay": 0.4}, decode_opts=CHECKS, claim_queue_tokens=0)
    follow_up = await first_turn(http, s, "a")
    await chat(http, s.url, [*follow_up, user("once more " + LONG)], conversation="a")  # learns: no valve
    follow_up = await first_turn(http, s, "c")
    long_one = asyncio.create_task(chat(http, s.url, [user("b " + LONG)], conversation="b"))
    await asyncio.sleep(0.1)
    reused = asyncio.create_task(chat(http, s.url, follow_up, conversation="c"))
    await asyncio.sleep(0.15)
    assert s.router.claim_gate.waiting() == 0  # nothing to claim on this decode: straight to prefill
    await long_one
    status, headers, _ = await reused
    assert (status, headers["X-PDX-Reuse"]) == (200, "hit")
