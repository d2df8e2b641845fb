"""First turns per leg: the two hops, each engine's own share of them, and what is left."""

from __future__ import annotations

import pytest

from pdx_bench.enginemetrics import QUEUE_TIME, TTFT, XFER_TIME, GroupEngines, Hist, Snapshot
from pdx_bench.firstturn import HEADERS, first_turns, rows
from pdx_bench.records import RequestRecord

from .synth import record


def _window(decode_ttft_s: float, decode_queue_s: float, n: int) -> Snapshot:
    return {
        "prefill": {TTFT: Hist(0.5 * n, n), QUEUE_TIME: Hist(0.0, n)},
        "decode": {
            TTFT: Hist(decode_ttft_s * n, n),
            QUEUE_TIME: Hist(decode_queue_s * n, n),
            XFER_TIME: Hist(0.002 * n, n),
        },
    }


def _leg(leg: str, decode_hop_ms: float) -> list[RequestRecord]:
    # Two first turns (prefill hop 520 ms) and a follow-up that must stay out of the rows.
    recs = [
        record(leg, 16000, 1, 520.0 + decode_hop_ms + d, prefill=520.0, reuse="miss", conv=c)
        for c, d in (("c0", 0), ("c1", 10))
    ]
    return [*recs, record(leg, 16000, 2, 40.0, prefill=0.0, reuse="local")]


def test_each_legs_first_turns_split_decodes_hop_into_engine_queue_and_api() -> None:
    records = _leg("off", 60.0) + _leg("on", 85.0)
    engines = {
        "off": {16000: GroupEngines(all_turns={}, first_turns=_window(0.030, 0.010, 2))},
        "on": {16000: GroupEngines(all_turns={}, first_turns=_window(0.050, 0.030, 2))},
    }
    off, on = first_turns(records, engines)
    assert (off.leg, off.n, on.leg, on.n) == ("off", 2, "on", 2)
    assert off.decode_hop == pytest.approx(65.0) and on.decode_hop == pytest.approx(90.0)
    assert on.decode["ttft"].mean_ms == pytest.approx(50.0) and on.decode["queue"].mean_ms == pytest.approx(30.0)
    # what the engine did not count is the API server's and HTTP's: 65 - 30 and 90 - 50
    assert off.decode_api_ms == pytest.approx(35.0) and on.decode_api_ms == pytest.approx(40.0)
    assert on.prefill_api_ms == pytest.approx(20.0)
    table = rows([off, on])
    assert len(table[0]) == len(HEADERS) and table[1][:3] == ("on", "16000", "2")


def test_a_leg_not_scraped_per_turn_shows_its_hops_and_blank_engine_figures() -> None:
    (row,) = first_turns(_leg("on", 80.0), {"on": {16000: GroupEngines(all_turns={})}})
    assert row.decode_hop == pytest.approx(85.0)
    assert row.decode["ttft"].count is None and row.decode_api_ms is None
    assert rows([row])[0][HEADERS.index("D engine TTFT")] == "-"


def test_the_bound_has_no_hops_and_gets_no_row() -> None:
    assert first_turns([record("bound", 16000, 1, 700.0)], {}) == []
