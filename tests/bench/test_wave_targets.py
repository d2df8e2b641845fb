"""The wave's targets judged from its parts' files (`pdx_bench.wavetargets`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pdx_bench import wavetargets as wt


def _point(leg: str, prefix: int, p50: float = 100.0, p99: float = 100.0, **more: Any) -> dict[str, Any]:
    return {"leg": leg, "prefix_tokens": prefix, "ttft_p50": p50, "ttft_p99": p99, **more}


def test_the_sweeps_longest_point_compares_the_p99s_there_only() -> None:
    sweep = {"points": [_point("on", 8000, p99=900), _point("off", 8000, p99=100),
                        _point("on", 32000, p99=51), _point("off", 32000, p99=1291)]}  # fmt: skip
    v = wt.sweep_longest_p99(sweep)
    assert v.met is True and v.figure == "32000: ON 51 ms, OFF 1291" and v.issue == 41
    sweep["points"][2]["ttft_p99"] = 1300.0
    assert wt.sweep_longest_p99(sweep).met is False


def test_the_overcommit_point_needs_the_p99_and_no_wait() -> None:
    band = {"ratio": 0.9, "low": 0.8, "high": 1.1}
    ok = {"points": [_point("on", 16000, p99=90, ttft_p99_over_off=band, waited_on_held=0), _point("off", 16000)]}
    assert wt.overcommit(ok).met is True
    assert "0.90x (0.80-1.10); waited 0" in wt.overcommit(ok).figure
    ok["points"][0]["waited_on_held"] = 1
    assert wt.overcommit(ok).met is False  # one wait fails it, whatever the p99
    ok["points"][0]["waited_on_held"] = None  # a decode without pdx's plugin: the wait is unknown
    assert wt.overcommit(ok).met is None


def test_each_prefix_is_over_its_own_bound_and_every_one_must_hold() -> None:
    suffix = {
        "points": [
            *(_point("bound", 12000, p50=93), _point("on", 12000, p50=98), _point("dp", 12000, p50=141)),
            *(_point("bound", 20000, p50=105), _point("on", 20000, p50=116), _point("dp", 20000, p50=120)),
        ]
    }
    on = wt.over_bound(suffix, "on", "on")
    assert on.met is True and on.figure == "1.05x at 12k, 1.10x at 20k"
    dp = wt.over_bound(suffix, "dp", "dp")
    assert dp.met is False and dp.figure.startswith("1.52x at 12k")  # 20k's 1.14x does not save 12k


def test_a_part_that_did_not_run_is_not_judged(tmp_path: Path) -> None:
    items = wt.verdicts(tmp_path, None)
    assert len(items) == 9 and all(v.met is None and v.figure == "-" for v in items)
    assert "| - |" in wt.markdown_table(items)


def test_first_turns_growth_and_the_correctness_check() -> None:
    rows = [{"length": 2000, "first_on_over_off": 0.98}, {"length": 16000, "first_on_over_off": 1.038}]
    assert wt.first_turns(rows).met is False and "1.038x at 16k" in wt.first_turns(rows).figure
    with_90: list[dict[str, object]] = [
        {**rows[0], "first_on_over_off_90": [0.9, 1.05]},
        {**rows[1], "first_on_over_off_90": [1.01, 1.10]},
    ]
    figure = wt.first_turns(with_90).figure
    assert figure == "0.980x at 2k, 1.038x at 16k (90%: 1.01-1.10x)"
    assert wt.growth(1.49).met is True and wt.growth(1.51).met is False and wt.growth(None).met is None
    failed = {
        "passed": False,
        "checks": [{"name": "greedy_outputs_equal", "passed": False}, {"name": "x", "passed": True}],
    }
    assert wt.correct(failed).figure == "FAIL: greedy_outputs_equal" and wt.correct(failed).met is False
    assert wt.correct({"passed": False, "error": "OutOfTime"}).figure == "FAIL: OutOfTime"


def test_the_correctness_runs_third_leg_is_judged_apart_from_the_defaults() -> None:
    """FIRST_TOKEN=1: prefill's first token failing does not fail the defaults, and is its own verdict."""
    checks = [
        {"name": "greedy_outputs_equal", "passed": True, "detail": "23 of 23"},
        {"name": "first_token_text_equal", "passed": False, "detail": "grow turn 1: 'a' != 'b'"},
        {"name": "first_token_from_prefill", "passed": True, "detail": "23 of 23 turns opened"},
    ]
    summary = {"passed": False, "checks": checks}
    assert wt.correct(summary).met is True
    (third,) = wt.correct_first(summary)
    assert third.met is False and third.figure.startswith("FAIL: first_token_text_equal (grow turn 1")
    assert wt.correct_first({"passed": True, "checks": checks[:1]}) == []  # no third run, no verdict


@pytest.mark.parametrize(("local", "rise", "met"), [(16, 0.013, True), (16, 0.12, False), (0, 0.0, None)])
def test_tpot_is_judged_only_where_turns_went_local(local: int, rise: float, met: bool | None) -> None:
    point = {"suffix_tokens": 512, "tpot_rise": rise, "local": {"outcomes": {"local": local} if local else {"hit": 16}}}
    assert wt.tpot({"points": [point]}).met is met


def test_the_files_of_a_wave_are_read_by_part(tmp_path: Path) -> None:
    (tmp_path / "correct").mkdir()
    (tmp_path / "correct" / "summary.json").write_text(json.dumps({"passed": True, "checks": []}))
    (tmp_path / "sweep").mkdir()
    points = [_point("on", 32000, p99=50), _point("off", 32000, p99=1200)]
    (tmp_path / "sweep" / "summary.json").write_text(json.dumps({"points": points}))
    got = {v.target: v.met for v in wt.verdicts(tmp_path, {"rows": [], "on_growth_8k_24k": 1.4})}
    assert got["gpu-correct.sh with the defaults"] is True
    assert got["the sweep's longest point: ON p99 <= OFF p99"] is True
    assert got["ON p50 growth from 8k to 24k <= 1.5x"] is True
    assert wt.to_json(wt.verdicts(tmp_path, None))[0]["issue"] == 41


def test_prefills_first_token_is_judged_only_where_the_part_ran() -> None:
    assert wt.first_token(None) == []  # the default wave has no part `first`
    points = [_point("bound", 12000, p50=90), _point("dp", 12000, p50=135), _point("dp-first", 12000, p50=100)]
    first = {"points": points}
    dp, dp_first, on_first, steady = wt.first_token(first)
    assert (dp.met, dp.figure) == (False, "1.50x at 12k")
    assert (dp_first.met, dp_first.figure) == (True, "1.11x at 12k")
    assert on_first.met is None and steady.met is None  # that leg did not run


def test_the_switch_is_judged_by_decodes_tpot_after_the_second_token_beside_on() -> None:
    on = _point("on", 12000, steady_tpot_p50=7.0, latency_p50=320.0)
    fast = _point("on-first", 12000, steady_tpot_p50=7.6, latency_p50=336.0)
    steady = wt.steady_tpot({"points": [on, fast]})
    assert (steady.met, steady.figure) == (True, "1.09x at 12k (whole answer 1.05x)")
    slow = {**fast, "steady_tpot_p50": 7.8}
    assert wt.steady_tpot({"points": [on, slow]}).met is False
    assert wt.steady_tpot({"points": [on, {**fast, "steady_tpot_p50": None}]}).met is None


def test_the_switchs_streams_are_judged_by_their_tpot_p90_per_point_beside_dp() -> None:
    def point(leg: str, suffix: int, p90: float | None) -> dict[str, object]:
        return {"leg": leg, "prefix_tokens": 16000, "suffix_tokens": suffix, "tpot_p90": p90}

    dp = [point("dp", 512, 8.0), point("dp", 1024, 8.5)]
    met = wt.switch_streams({"points": [*dp, point("dp-first", 512, 8.64), point("dp-first", 1024, 8.5)]})
    assert met.met is True and met.figure == "+8% at 512 new tokens, +0% at 1024 new tokens"
    assert wt.switch_streams({"points": [*dp, point("dp-first", 512, 8.9)]}).met is False  # +11%
    assert wt.switch_streams({"points": dp}).met is None  # the leg was skipped
    assert wt.switch_streams(None).figure == "-"
