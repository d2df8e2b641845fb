"""Faults around decode's held KV under pressure (docs/router.md, "Held KV under memory
pressure"): a release forced during a read, and a decode that restarts or dies around a claim.
No turn may read released KV, fail, or hang."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from pdx_router.testing.fake_engine import Cluster, EngineOptions
from tests.faults.conftest import KillableEngine
from tests.faults.tally import TALLY
from tests.faults.test_infrastructure import Conversation, injected, stats, survived, tally_reads, until
from tests.router.conftest import StackFactory

pytestmark = pytest.mark.faults
VALVE: dict[str, object] = {"checks_prefix": True, "valve": True}


async def test_pressure_during_a_read_passes_the_claimed_hold_by(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(prefill_opts={"checks_prefix": True, "prefill_delay": 0.3}, decode_opts=VALVE)
    convs = [Conversation(f"press-{i}") for i in range(3)]
    for conv in convs:
        await conv.turn(http, s.url)
    fault = injected("held KV released under pressure during reads")
    pending = [asyncio.create_task(conv.turn(http, s.url)) for conv in convs[:2]]
    await until(lambda: sum(s.cluster.claims.values()) == 2, what="two reads claimed")
    released = [rid for (_, rid) in list(s.cluster.held) if s.decode.release(rid)]
    assert len(released) == 1  # only the third conversation's hold was free to go
    results = await asyncio.gather(*pending)
    assert [h["X-PDX-Reuse"] for _, h, _ in results] == ["hit", "hit"]
    status, headers, _ = await convs[2].turn(http, s.url)
    assert status == 200 and headers["X-PDX-Reuse"] == "released"
    tally_reads(s.cluster)
    assert all(r.correct for r in s.cluster.reads) and s.cluster.unclaimed_reads == 0
    assert (await stats(http, s.url))["reuse"]["released"] == 1
    survived(fault)


async def test_a_decode_restarted_between_turns_answers_gone_and_the_turn_recomputes(
    make_stack: StackFactory, http: aiohttp.ClientSession, killable: list[KillableEngine]
) -> None:
    cl = Cluster()
    k = KillableEngine(cl, EngineOptions("decode", "decode-0", checks_prefix=True, valve=True))
    await k.start()
    cl.valves.add("decode-0")
    killable.append(k)
    s = await make_stack(
        n_decode=0, cluster=cl, decode=(k.url,), prefill_opts={"checks_prefix": True}, health_check_interval_seconds=0.1
    )
    conv = Conversation("restart-1")
    await conv.turn(http, s.url)
    fault = injected("decode restarted between turns (its held KV gone)")
    await k.kill()
    for key in [key for key in cl.held if key[0] == "decode-0"]:  # a new engine holds nothing
        del cl.held[key]
    await k.start()
    dead = s.router.pool.endpoints[-1]
    await until(lambda: dead.healthy, what="the decode back in")
    status, headers, _ = await conv.turn(http, s.url)
    assert status == 200 and headers["X-PDX-Reuse"] == "released"
    status, headers, _ = await conv.turn(http, s.url)
    assert status == 200 and headers["X-PDX-Reuse"] == "hit"  # its answer is held again
    tally_reads(cl)
    assert all(r.correct for r in cl.reads)
    survived(fault)


async def test_a_decode_that_dies_before_the_claim_sends_the_turn_elsewhere_without_reuse(
    make_stack: StackFactory, http: aiohttp.ClientSession, killable: list[KillableEngine]
) -> None:
    cl = Cluster()
    for i in range(2):
        k = KillableEngine(cl, EngineOptions("decode", f"decode-{i}", checks_prefix=True, valve=True))
        await k.start()
        cl.valves.add(f"decode-{i}")
        killable.append(k)
    s = await make_stack(
        n_decode=0,
        cluster=cl,
        decode=tuple(k.url for k in killable),
        prefill_opts={"checks_prefix": True},
        health_check_interval_seconds=60,  # the claim, not a health check, finds it dead
    )
    conv = Conversation("dies-before-claim")
    await conv.turn(http, s.url)
    [(engine_id, _)] = list(cl.held)
    victim = next(k for k in killable if k.opts.engine_id == engine_id)
    fault = injected("decode died before the claim on its held KV")
    await victim.kill()
    status, headers, _ = await conv.turn(http, s.url)
    assert status == 200 and headers["X-PDX-Reuse"] == "expired"
    assert not cl.reads  # nothing was read from the dead decode
    TALLY.notes.append("claim on a dead decode: turn answered on the other decode, outcome expired")
    survived(fault)
