"""Repeated runs pooled per point and leg: `pdx bench pool`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pdx_bench import cli, pool
from pdx_bench.records import RequestRecord, write_records

from .synth import record


def _turn(leg: str, turn: int, ttft: float, live: int = 4, reuse: str | None = None) -> RequestRecord:
    return replace(record(leg, 1500, turn, ttft, reuse=reuse), live_conversations=live)


def _run(
    tmp: Path, name: str, legs: dict[str, list[RequestRecord]], points: list[dict[str, object]] | None = None
) -> Path:
    out = tmp / name
    for leg, records in legs.items():
        write_records(out / f"records-{leg}.json", records)
    if points is not None:
        (out / "summary.json").write_text(json.dumps({"points": points}))
    return out


def _point(leg: str, waited: int, releases: int, overcommit: float, live: int = 4) -> dict[str, object]:
    return {"leg": leg, "prefix_tokens": 1500, "suffix_tokens": None, "live": live, "waited_on_held": waited,
            "releases": releases, "overcommit": overcommit}  # fmt: skip


def test_a_repeat_leg_folds_into_its_leg_and_runs_add_their_turns(tmp_path: Path) -> None:
    a = _run(tmp_path, "a", {
        "off": [_turn("off", 1, 900.0), *(_turn("off", 2, t, reuse="miss") for t in (100.0, 200.0))],
        "on": [_turn("on", 2, 50.0, reuse="hit"), _turn("on", 2, 60.0, reuse="released")],
        "on-b": [_turn("on-b", 2, 70.0, reuse="local")],
    })  # fmt: skip
    b = _run(tmp_path, "b", {"off": [_turn("off", 2, 300.0, reuse="miss")], "on": [_turn("on", 2, 80.0, reuse="hit")]})
    same = pool.parse_same(["on-b=on"])
    pooled = {p.leg: p for p in pool.pool([pool.read_run(a, same), pool.read_run(b, same)])}
    assert set(pooled) == {"off", "on"}
    assert sorted(pooled["off"].ttfts) == [100.0, 200.0, 300.0]  # the first turn (900) is not a follow-up
    assert pooled["off"].runs == 2 and pooled["on"].runs == 2
    assert sorted(pooled["on"].ttfts) == [50.0, 60.0, 70.0, 80.0]
    assert pooled["on"].outcomes == {"hit": 2, "local": 1, "released": 1}
    assert pooled["on"].reused == 3


def test_each_leg_is_compared_with_the_base_legs_percentile_and_an_interval(tmp_path: Path) -> None:
    off = [_turn("off", 2, float(t), reuse="miss") for t in range(100, 1100, 100)]
    on = [_turn("on", 2, float(t) / 2, reuse="hit") for t in range(100, 1100, 100)]
    pooled = {p.leg: p for p in pool.pool([pool.read_run(_run(tmp_path, "a", {"off": off, "on": on}), {})])}
    ratio, low, high = pool.against(pooled["on"], pooled["off"], 99) or (0.0, 0.0, 0.0)
    assert ratio == pytest.approx(0.5)
    assert low <= ratio <= high
    assert pool.against(pooled["off"], pooled["off"], 99) is None  # the base has no ratio of its own
    row = {r[2]: r for r in pool.rows(list(pooled.values()), "off")}
    assert row["on"][9].startswith("0.50 (")
    assert row["off"][9] == "-"
    assert row["on"][10] == "10/10 (100%)"


def test_decodes_figures_of_a_point_are_summed_over_runs_and_legs_folded(tmp_path: Path) -> None:
    legs = {"off": [_turn("off", 2, 100.0)], "on": [_turn("on", 2, 90.0)], "on-b": [_turn("on-b", 2, 95.0)]}
    a = _run(tmp_path, "a", legs, [_point("off", 0, 0, 2.0), _point("on", 1, 10, 2.0), _point("on-b", 0, 7, 2.0)])
    b = _run(tmp_path, "b", legs, [_point("off", 0, 0, 1.9), _point("on", 0, 3, 1.9), _point("on-b", 2, 4, 1.9)])
    c = _run(tmp_path, "c", legs)  # no summary.json: adds turns, not figures
    same = {"on-b": "on"}
    pooled = {p.leg: p for p in pool.pool([pool.read_run(d, same) for d in (a, b, c)])}
    assert pooled["on"].waited == 3 and pooled["on"].releases == 24
    assert pooled["on"].overcommit == pytest.approx(1.95)
    assert len(pooled["on"].ttfts) == 6


def test_points_stay_apart_and_first_turns_are_pooled_on_request(tmp_path: Path) -> None:
    run = _run(tmp_path, "a", {"off": [
        _turn("off", 1, 500.0, live=4), _turn("off", 2, 100.0, live=4), _turn("off", 2, 200.0, live=8),
    ]})  # fmt: skip
    follow = pool.pool([pool.read_run(run, {})])
    assert [(p.point.live, p.ttfts) for p in follow] == [(4, (100.0,)), (8, (200.0,))]
    first = pool.pool([pool.read_run(run, {}, first=True)])
    assert [(p.point.live, p.ttfts) for p in first] == [(4, (500.0,))]


def test_a_failed_request_is_left_out(tmp_path: Path) -> None:
    run = _run(tmp_path, "a", {"off": [_turn("off", 2, 100.0), replace(_turn("off", 2, 5.0), http_status=502)]})
    (p,) = pool.pool([pool.read_run(run, {})])
    assert p.ttfts == (100.0,)


@pytest.mark.parametrize("pair", ["on-b", "=on", "on-b="])
def test_a_same_pair_without_both_legs_names_the_form(pair: str) -> None:
    with pytest.raises(ValueError, match="expected LEG=AS"):
        pool.parse_same([pair])


def _pool(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["bench", "pool", *argv])
    return int(args.run(args))


def test_the_command_prints_the_table_and_writes_the_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path, "a", {"off": [_turn("off", 2, 100.0)], "on": [_turn("on", 2, 80.0, reuse="hit")]})
    assert _pool([str(run), "--json", str(tmp_path / "pooled.json")]) == 0
    table = capsys.readouterr().out
    assert "| 1500 x4 live |" in table and "| on |" in table
    doc = {d["leg"]: d for d in json.loads((tmp_path / "pooled.json").read_text())}
    assert doc["on"]["ttft_p99_over_base"]["ratio"] == pytest.approx(0.8)
    assert doc["off"]["ttft_p99_over_base"] is None


def test_the_command_names_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert _pool([str(tmp_path / "empty")]) == 2
    assert "no records-<leg>.json" in capsys.readouterr().err
    run = _run(tmp_path, "a", {"on": [_turn("on", 2, 80.0)]})
    assert _pool([str(run)]) == 2
    assert "no leg 'off' (--base); legs: ['on']" in capsys.readouterr().err
    assert _pool([str(run), "--same", "on"]) == 2
    assert "expected LEG=AS" in capsys.readouterr().err
