"""Decode's held KV under memory pressure, between the fake engines: a turn reads only a hold
decode pinned for it, a released hold makes the next turn `released` (plain P/D at once, never
a failed read), and an engine without the valve is read as before."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from pdx_contract.holds import CLAIM_LEASE_S

from .conftest import Stack, StackFactory
from .helpers import LONG, assistant, chat, user

Messages = list[dict[str, Any]]
CHECKS = {"checks_prefix": True}


async def turn(
    http: aiohttp.ClientSession, s: Stack, msgs: Messages, conversation: str | None = None
) -> tuple[str, Messages]:
    status, headers, data = await chat(http, s.url, msgs, conversation=conversation, stream=False)
    assert status == 200, data
    return headers["X-PDX-Reuse"], [*msgs, assistant(data["choices"][0]["message"]["content"])]


async def three_turns(http: aiohttp.ClientSession, s: Stack) -> list[str]:
    """Three turns of one conversation (by id), each adding a long message: their outcomes."""
    msgs: Messages = [user(LONG)]
    outcomes = []
    for i in range(3):
        outcome, msgs = await turn(http, s, msgs, "c1")
        outcomes.append(outcome)
        msgs.append(user(f"step {i} " + LONG))
    return outcomes


async def metrics(http: aiohttp.ClientSession, s: Stack) -> str:
    async with http.get(s.url + "/metrics") as r:
        return await r.text()


def holds_calls(s: Stack) -> list[dict[str, Any]]:
    """The router's claims and drops (its health checks' empty polls left out)."""
    return [
        body for path, body in s.decode.requests if path == "/v1/pdx/holds" and (body["claim"] or body["releaseClaim"])
    ]


@pytest.mark.parametrize("conversation", [None, "c1"], ids=["by-history", "by-id"])
async def test_a_read_is_claimed_first_and_its_claim_dropped_after_prefill_answered(
    make_stack: StackFactory, http: aiohttp.ClientSession, conversation: str | None
) -> None:
    s = await make_stack(prefill_opts=CHECKS, decode_opts={**CHECKS, "valve": True})
    s.router.drops.flush_seconds = 0.05
    first, msgs = await turn(http, s, [user(LONG)], conversation)
    second, _ = await turn(http, s, [*msgs, user("and then? " + LONG)], conversation)
    assert (first, second) == ("miss", "hit")
    assert s.cluster.reads and all(r.correct for r in s.cluster.reads)
    assert s.cluster.unclaimed_reads == 0
    await asyncio.sleep(0.2)  # past the drops' flush
    assert not +s.cluster.claims and s.router.drops.pending() == 0
    # dropped even though the read frees the hold: a read whose notice decode's worker does not
    # take would otherwise leave the hold pinned by the claim
    claim, drop = holds_calls(s)
    assert claim["claim"] != [] and claim["releaseClaim"] == []
    assert drop["claim"] == [] and drop["releaseClaim"] == claim["claim"]
    assert 'pdx_router_held_kv_claims_total{answer="held"} 1.0' in await metrics(http, s)


UNREAD = {**CHECKS, "kv_recompute_threshold": 1 << 20}  # prefill finds every hold below its threshold


async def test_a_claim_on_a_hold_prefill_did_not_read_is_dropped_after_prefill(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(prefill_opts=UNREAD, decode_opts={**CHECKS, "valve": True})
    s.router.drops.flush_seconds = 0.05
    first, msgs = await turn(http, s, [user(LONG)])
    second, _ = await turn(http, s, [*msgs, user("and then? " + LONG)])
    assert (first, second) == ("miss", "below_threshold")
    assert all(r.tokens == 0 for r in s.cluster.reads)  # nothing read
    for _ in range(100):  # the claim is dropped off the turn's path
        if not +s.cluster.claims:
            break
        await asyncio.sleep(0.01)
    assert not +s.cluster.claims
    [claim, drop] = holds_calls(s)  # nothing else to ride with: the drop went alone, shortly after
    assert claim["claim"] == drop["releaseClaim"] != [] and drop["claim"] == []


async def test_the_claims_time_is_reported_as_the_routers_own_not_as_a_hop(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    """X-PDX-Router-Ms holds what the router spent before its first hop (the claim on decode's
    hold included), so a slow claim is not read as a slow decode hop (TTFT - both headers)."""
    s = await make_stack(prefill_opts=CHECKS, decode_opts={**CHECKS, "valve": True, "claim_delay": 0.15})
    status, first, data = await chat(http, s.url, [user(LONG)], stream=False)
    assert status == 200 and first["X-PDX-Reuse"] == "miss"
    msgs = [user(LONG), assistant(data["choices"][0]["message"]["content"]), user("and then? " + LONG)]
    status, second, _ = await chat(http, s.url, msgs, stream=False)
    assert status == 200 and second["X-PDX-Reuse"] == "hit"
    assert float(first["X-PDX-Router-Ms"]) < 150  # no hold yet: nothing claimed
    assert float(second["X-PDX-Router-Ms"]) >= 150  # the claim's answer waited 150 ms
    assert float(second["X-PDX-Prefill-Ms"]) < 150


async def test_a_dropped_claim_rides_with_the_next_claim_to_that_decode(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(prefill_opts=UNREAD, decode_opts={**CHECKS, "valve": True})
    s.router.drops.flush_seconds = 60.0  # no flush on its own within the test
    assert await three_turns(http, s) == ["miss", "below_threshold", "below_threshold"]
    calls = holds_calls(s)
    assert len(calls) == 2  # two claiming turns, two calls: the first drop rode with the second claim
    assert calls[1]["releaseClaim"] == calls[0]["claim"]
    assert s.router.drops.pending() == 1 and sum(s.cluster.claims.values()) == 1  # the last, until a flush


async def test_a_hold_released_under_pressure_makes_the_next_turn_released_without_a_failed_read(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(prefill_opts=CHECKS, decode_opts={**CHECKS, "valve": True})
    _, msgs = await turn(http, s, [user(LONG)])
    [(_, rid)] = list(s.cluster.held)
    assert s.decodes[0].release(rid)
    outcome, msgs = await turn(http, s, [*msgs, user("and then? " + LONG)])
    assert outcome == "released"
    assert not s.cluster.reads  # prefill was never pointed at the released blocks
    assert len([p for p, _ in s.prefill.requests if p != "/tokenize"]) == 2  # no retry was needed
    # the released turn's own answer is held again: the turn after it reuses
    outcome, _ = await turn(http, s, [*msgs, user("and after that? " + LONG)])
    assert outcome == "hit"
    async with http.get(s.url + "/v1/pdx/stats") as r:
        stats = await r.json()
    assert stats["reuse"]["released"] == 1
    # the released turn's claim was answered gone, the next turn's held (what `pdx bench` keeps per leg)
    assert stats["claims"] == {"held": 1, "gone": 1, "no_valve": 0, "failed": 0, "unreachable": 0}
    assert 'pdx_router_reuse_total{outcome="released"} 1.0' in await metrics(http, s)


async def test_a_release_decode_named_in_an_earlier_answer_makes_the_turn_released_without_a_claim(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(prefill_opts=CHECKS, decode_opts={**CHECKS, "valve": True})
    a, b = [user("a " + LONG)], [user("b " + LONG)]
    _, a = await turn(http, s, a, "a")
    _, b = await turn(http, s, b, "b")
    rid_a = next(rid for (_, rid) in s.cluster.held)
    assert s.decodes[0].release(rid_a)
    outcome, b = await turn(http, s, [*b, user("and then? " + LONG)], "b")  # its claim's answer names a's release
    assert outcome == "hit"
    assert holds_calls(s)[-1]["since"] == 0
    calls = len(holds_calls(s))
    outcome, _ = await turn(http, s, [*a, user("and then? " + LONG)], "a")
    assert outcome == "released"
    assert len(holds_calls(s)) == calls  # no claim: decode had said so
    assert len(s.cluster.reads) == 1 and s.cluster.reads[0].correct  # b's read only: a's blocks were never read
    assert [e.released_seq for e in s.router.pool.endpoints if e.role == "decode"] == [1]


@pytest.mark.parametrize("notes", [True, False], ids=["noted", "without-notes"])
async def test_a_release_named_in_another_conversations_answer_spares_the_released_turn_its_claim(
    make_stack: StackFactory, http: aiohttp.ClientSession, notes: bool
) -> None:
    s = await make_stack(prefill_opts=CHECKS, decode_opts={**CHECKS, "valve": True, "notes_releases": notes})
    _, a = await turn(http, s, [user("a " + LONG)], "a")
    [(_, rid_a)] = list(s.cluster.held)
    assert s.decodes[0].release(rid_a)
    _, c = await turn(http, s, [user("c " + LONG)], "c")  # a first turn: no claim; its answer names a's release
    outcome, _ = await turn(http, s, [*a, user("and then? " + LONG)], "a")
    assert outcome == "released"
    assert not s.cluster.reads
    # with the note the router knew, and asked decode nothing; without it, it claimed and heard
    assert len(holds_calls(s)) == (0 if notes else 1)
    decode = next(e for e in s.router.pool.endpoints if e.role == "decode")
    assert decode.released_seq == 1
    # the note is the router's: the entry kept for c's next turn carries no trace of it
    outcome, _ = await turn(http, s, [*c, user("and then? " + LONG)], "c")
    [read] = [body["kv_transfer_params"] for path, body in s.prefill.requests if path != "/tokenize"][-1:]
    assert outcome == "hit" and read.get("do_remote_decode") and "pdx_released" not in read


async def test_a_claimed_hold_is_not_released_while_prefill_reads_it(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(prefill_opts={**CHECKS, "prefill_delay": 0.3}, decode_opts={**CHECKS, "valve": True})
    _, msgs = await turn(http, s, [user(LONG)])
    [(_, rid)] = list(s.cluster.held)
    pending = asyncio.create_task(turn(http, s, [*msgs, user("and then? " + LONG)]))
    for _ in range(100):  # until the claim is in
        if s.cluster.claims[("decode-0", rid)]:
            break
        await asyncio.sleep(0.01)
    assert not s.decodes[0].release(rid)  # pressure during the read: the valve passes it by
    outcome, _ = await pending
    assert outcome == "hit" and s.cluster.reads[0].correct


async def test_a_decode_without_the_route_is_read_as_before_and_never_claimed(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(prefill_opts=CHECKS, decode_opts=CHECKS)
    assert await three_turns(http, s) == ["miss", "hit", "hit"]
    # the start-up health check's poll found no route: no turn ever claims
    assert [e.claims for e in s.router.pool.endpoints if e.role == "decode"] == [False]
    assert 'pdx_router_held_kv_claims_total{answer="no_valve"} 0.0' in await metrics(http, s)


async def test_each_health_check_polls_decodes_held_kv_for_metrics_stats_and_releases(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(prefill_opts=CHECKS, decode_opts={**CHECKS, "valve": True})
    _, msgs = await turn(http, s, [user(LONG)], "c1")
    [(_, rid)] = list(s.cluster.held)
    assert s.decodes[0].release(rid)
    await s.router.discovery.check_all()  # a health check: no claim, no turn
    text = await metrics(http, s)
    assert 'pdx_router_decode_held_kv_valve{decode="' in text and "} 1.0" in text
    assert "pdx_router_decode_held_kv_releases_total{" in text and "pdx_router_decode_kv_capacity_blocks{" in text
    assert "pdx_router_decode_held_kv_claimed{" in text and "pdx_router_decode_held_kv_lapsed_total{" in text
    assert s.decode_urls[0].split("//")[1] not in text  # clients read /metrics: no engine address
    async with http.get(s.url + "/v1/pdx/stats") as r:
        held = (await r.json())["heldKv"]
    assert held == {
        "decodes": 1, "valveOff": 0, "heldBlocks": 0, "capacityBlocks": 1024, "releases": 1, "trims": 0, "waited": 0,
        "claimed": 0, "lapsed": 0,
    }  # fmt: skip
    calls = len(holds_calls(s))
    outcome, _ = await turn(http, s, [*msgs, user("and then? " + LONG)], "c1")
    assert outcome == "released" and len(holds_calls(s)) == calls  # the poll had said so: no claim


async def test_a_decode_without_the_route_counts_as_valve_off_in_the_stats(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(prefill_opts=CHECKS, decode_opts=CHECKS)
    await s.router.discovery.check_all()
    async with http.get(s.url + "/v1/pdx/stats") as r:
        held = (await r.json())["heldKv"]
    assert (held["decodes"], held["valveOff"]) == (1, 1)
    assert "pdx_router_decode_held_kv_valve{" not in await metrics(http, s)


@pytest.mark.parametrize("checks", [CHECKS, {}], ids=["engines-check", "router-checks"])
async def test_a_hold_decode_shortened_is_read_only_up_to_what_it_kept(
    make_stack: StackFactory, http: aiohttp.ClientSession, checks: dict[str, Any]
) -> None:
    s = await make_stack(prefill_opts=checks, decode_opts={**checks, "valve": True})
    _, msgs = await turn(http, s, [user(LONG)])
    [(key, held)] = list(s.cluster.held.items())
    kept = len(held.block_ids) - 2  # the answer's tail and a block of the prompt freed
    assert s.decodes[0].shorten(key[1], kept)
    outcome, _ = await turn(http, s, [*msgs, user("and then? " + LONG)])
    assert outcome == "hit"
    [read] = s.cluster.reads
    assert read.correct, read.reason
    assert read.tokens == kept * s.cluster.block_size and s.cluster.unclaimed_reads == 0


async def test_a_claim_is_leased_and_prefill_is_told_to_start_the_read_before_the_lease_ends(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(prefill_opts=CHECKS, decode_opts={**CHECKS, "valve": True})
    assert s.decode.opts.decode_ttl > CLAIM_LEASE_S  # so only the lease can set the read's deadline
    first, msgs = await turn(http, s, [user(LONG)])
    before = time.perf_counter()
    second, _ = await turn(http, s, [*msgs, user("and then? " + LONG)])
    assert (first, second) == ("miss", "hit")
    [claim] = holds_calls(s)
    assert claim["lease"] is True
    [deadline] = [
        body["kv_transfer_params"]["remote_blocks_expiry_time"]
        for path, body in s.prefill.requests
        if (body.get("kv_transfer_params") or {}).get("remote_request_id")
    ]
    assert before + CLAIM_LEASE_S <= deadline <= time.perf_counter() + CLAIM_LEASE_S
    assert s.cluster.reads and all(r.correct for r in s.cluster.reads)
