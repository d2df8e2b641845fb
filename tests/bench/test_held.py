"""The overcommit points' figures: held demand over decode's capacity, and decode's own counts
of releases and of requests that waited behind held KV."""

from __future__ import annotations

import aiohttp
import pytest

from pdx_bench.held import HeldFigures, claims_line, held_demand, overcommit, read_holds
from pdx_bench.points import markdown_table, p99_over_off, point_stats, to_json
from pdx_bench.records import RequestRecord
from pdx_router.testing.fake_engine import Cluster, EngineOptions, Held, start_engine


def record(conversation: str, turn: int, prompt: int, output: int = 32, leg: str = "on") -> RequestRecord:
    return RequestRecord(
        ttft_ms=100.0 * turn,
        tpot_ms=1.0,
        latency_ms=200.0,
        start_time_ms=float(turn),
        input_num_turns=turn,
        input_num_tokens=prompt,
        output_num_tokens=output,
        output_num_chunks=output,
        output_num_first_chunk_tokens=1,
        approx_cached_percent=0.0,
        conversation_id=conversation,
        client_id=0,
        turn=turn,
        leg=leg,
        prefix_tokens=1000,
        live_conversations=2,
    )


RECORDS = [record("a", 1, 1000), record("a", 2, 1300), record("b", 1, 1000), record("b", 2, 1300)]


def test_held_demand_is_each_conversations_longest_turn_with_its_answer() -> None:
    assert held_demand(RECORDS) == 2 * (1300 + 32)


def test_a_prefix_every_conversation_shares_is_held_once() -> None:
    assert held_demand(RECORDS, shared_tokens=1000) == 2 * (1300 + 32) - 1000
    assert overcommit(RECORDS, [1332], shared_tokens=1000) == pytest.approx((2664 - 1000) / 1332)
    one = [r for r in RECORDS if r.conversation_id == "a"]
    assert held_demand(one, shared_tokens=1000) == 1332  # nothing to share with


def test_overcommit_is_demand_over_every_decodes_capacity() -> None:
    assert overcommit(RECORDS, [1332]) == pytest.approx(2.0)
    assert overcommit(RECORDS, [666, 666]) == pytest.approx(2.0)


@pytest.mark.parametrize("capacity", [[], [None], [1000, None], [0]], ids=["none", "unknown", "one-unknown", "zero"])
def test_overcommit_is_not_guessed_without_every_decodes_capacity(capacity: list[int | None]) -> None:
    assert overcommit(RECORDS, capacity) is None


def test_a_point_carries_its_overcommit_p99_and_decodes_counts() -> None:
    key = ("on", 1000, None, 2)
    [point] = point_stats(RECORDS, held_by_point={key: HeldFigures(3, 0, 4)}, decode_capacity={"on": [1332]})
    out = to_json(point)
    assert out["overcommit"] == pytest.approx(2.0)
    assert (out["releases"], out["trims"], out["waited_on_held"]) == (3, 4, 0)
    assert out["ttft_p99"] == pytest.approx(200.0)
    assert out["ttft_p99_over_off"] is None  # no OFF leg ran this point


def test_each_legs_p99_is_read_against_offs_at_the_same_point_with_an_interval() -> None:
    def leg(name: str, slow: float) -> list[RequestRecord]:
        out = []
        for i in range(12):
            r = record(f"{name}{i}", 2, 1300, leg=name)
            r.ttft_ms = 100.0 + i + (slow if i == 11 else 0.0)  # one hiccup decides each leg's p99
            out.append(r)
        return out

    points = point_stats([*leg("off", 400.0), *leg("on", 100.0)])
    on = next(p for p in points if p.leg == "on")
    off = next(p for p in points if p.leg == "off")
    got = p99_over_off(on, points)
    assert got is not None
    ratio, low, high = got
    assert ratio == pytest.approx(on.ttft_p99 / off.ttft_p99) and ratio < 1
    assert low <= ratio <= high and high > 1  # a dozen turns' slowest cannot tell these two apart
    assert p99_over_off(off, points) is None
    assert to_json(on, points)["ttft_p99_over_off"] == {"ratio": ratio, "low": low, "high": high}
    assert "p99/OFF" in markdown_table(points) and f"{ratio:.2f} ({low:.2f}-{high:.2f})" in markdown_table(points)


async def test_decodes_counts_are_read_from_its_holds_route_and_absent_without_it() -> None:
    cluster = Cluster()
    valve, valve_runner, valve_url = await start_engine(cluster, EngineOptions("decode", "d0", valve=True))
    _, plain_runner, plain_url = await start_engine(cluster, EngineOptions("decode", "d1"))
    try:
        async with aiohttp.ClientSession() as session:
            assert await read_holds(session, [valve_url]) == HeldFigures(0, 0)
            valve.releases = 2
            valve.trims = 1
            assert await read_holds(session, [valve_url]) == HeldFigures(2, 0, 1)
            assert await read_holds(session, [valve_url, plain_url]) is None
            assert await read_holds(session, []) is None
    finally:
        await valve_runner.cleanup()
        await plain_runner.cleanup()


def test_figures_change_over_a_point() -> None:
    assert HeldFigures(5, 2, 7).since(HeldFigures(3, 2, 1)) == HeldFigures(2, 0, 6)
    assert HeldFigures(5, 2, 7, 3).since(HeldFigures(3, 2, 1, 1)) == HeldFigures(2, 0, 6, 2)


async def test_a_point_starts_from_an_empty_decode_its_unclaimed_holds_released_first() -> None:
    cluster = Cluster()
    _, runner, url = await start_engine(cluster, EngineOptions("decode", "d0", valve=True))
    cluster.held[("d0", "idle")] = Held(token_ids=[1, 2], block_ids=[7], expiry=1e12)
    cluster.held[("d0", "being-read")] = Held(token_ids=[3, 4], block_ids=[8], expiry=1e12)
    cluster.claims[("d0", "being-read")] = 1
    try:
        async with aiohttp.ClientSession() as session:
            assert await read_holds(session, [url]) == HeldFigures(0, 0)
            assert ("d0", "idle") in cluster.held  # reading the counters alone releases nothing
            assert await read_holds(session, [url], release_unclaimed=True) == HeldFigures(0, 0)  # not pressure
            assert set(cluster.held) == {("d0", "being-read")}  # a claimed hold stays
    finally:
        await runner.cleanup()


def test_a_legs_claims_line_names_each_answer_and_is_absent_without_claims() -> None:
    stats = {"reuse": {"hit": 3}, "claims": {"held": 4, "gone": 2, "no_valve": 0, "failed": 0, "unreachable": 1}}
    assert claims_line(stats) == "held 4, gone 2, no_valve 0, failed 0, unreachable 1"
    assert claims_line({"reuse": {"hit": 3}}) is None  # an older router: no claims field
    assert claims_line({"claims": {"held": 0}}) is None  # the router made none
    assert claims_line(None) is None  # no stats at all
