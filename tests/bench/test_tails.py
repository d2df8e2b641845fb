"""The slowest follow-ups per leg and point, each split into router, prefill hop and decode hop."""

from __future__ import annotations

from dataclasses import replace

from pdx_bench import tails
from pdx_bench.records import RequestRecord

from .synth import record


def _turn(
    leg: str, live: int, turn: int, ttft: float, start: float, reuse: str | None = None, prefill: float | None = None
) -> RequestRecord:
    r = record(leg, 16000, turn, ttft, conv=f"c{start:.0f}", reuse=reuse, prefill=prefill)
    return replace(r, live_conversations=live, start_time_ms=start)


def test_each_point_shows_its_slowest_follow_ups_slowest_first_and_no_first_turn() -> None:
    records = [
        _turn("on", 12, 1, 9000.0, 0),  # a first turn: never shown
        *(_turn("on", 12, 2, float(t), 10 + i, reuse="hit", prefill=t / 2) for i, t in enumerate([100, 700, 300, 500])),
        *(_turn("off", 12, 2, float(t), 100 + i, reuse="miss", prefill=t - 50) for i, t in enumerate([600, 650])),
    ]
    shown = tails.slowest(records, shown=3)
    assert [(r.leg, r.ttft_ms) for r in shown] == [("on", 700), ("on", 500), ("on", 300), ("off", 650), ("off", 600)]
    ranks = [(row[0], row[4]) for row in tails.rows(records, shown=3)]
    assert ranks == [("on", "1"), ("on", "2"), ("on", "3"), ("off", "1"), ("off", "2")]


def test_a_turn_is_split_into_the_routers_time_the_prefill_hop_and_the_decode_hop() -> None:
    released = replace(_turn("on", 12, 3, 7211.0, 5, reuse="released", prefill=4232.0), router_ms=1.0)
    local = replace(_turn("on", 12, 2, 2881.0, 6, reuse="local", prefill=0.0), router_ms=2.0)
    (first, second) = tails.rows([released, local], shown=2)
    assert first[7:] == ("released", "7211", "1", "4232", "2978")
    assert second[7:] == ("local", "2881", "2", "0", "2879")


def test_a_turn_without_the_routers_headers_shows_what_was_not_measured() -> None:
    (row,) = tails.rows([_turn("bound", 4, 2, 90.0, 1)], shown=3)
    assert row[7:] == ("-", "90", "-", "-", "-")


def test_the_table_names_its_columns_and_says_how_the_decode_hop_is_made() -> None:
    table = tails.markdown_table([_turn("on", 4, 2, 90.0, 1, reuse="hit", prefill=60.0)])
    assert table.splitlines()[0].startswith("| leg | prefix | suffix | live | rank |")
    assert "decode hop: TTFT - router - prefill hop" in table
