"""The decode-local report from synthetic runs: its table, and the threshold the numbers support."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pytest

from pdx_bench import cli
from pdx_bench.background import StreamRecord, write_streams
from pdx_bench.decodelocal import ISSUE_TARGETS, Targets, choose_threshold, compare, rise_interval, write_report
from pdx_bench.points import point_stats
from pdx_bench.records import RequestRecord, write_records

from .synth import record

HISTORIES = (8000, 16000)
SUFFIXES = (128, 512, 1024, 2048)
DP_TTFT = 200.0
DP_GAP = 5.0  # ms between the streams' tokens while D->P turns run


class Run:
    """Both legs of a sweep, point by point: local's TTFT as a share of D->P's, the streams'
    TPOT rise while local turns run, and how many local turns the router served locally."""

    def __init__(self, streams: bool = True) -> None:
        self.records: list[RequestRecord] = []
        self.streams: list[StreamRecord] = []
        self.with_streams = streams
        self.t = 0.0

    def point(self, prefix: int, suffix: int, ratio: float, rise: float = 0.0, local_turns: int = 2) -> None:
        for leg, ttft, gap, outcomes in (
            ("dp", DP_TTFT, DP_GAP, ["hit", "hit"]),
            ("local", DP_TTFT * ratio, DP_GAP * (1 + rise), ["local"] * local_turns + ["hit"] * (2 - local_turns)),
        ):
            self._turn(leg, prefix, suffix, 1, 900.0, "miss", DP_GAP)
            for turn, reuse in enumerate(outcomes, start=2):
                self._turn(leg, prefix, suffix, turn, ttft, reuse, gap)

    def _turn(self, leg: str, prefix: int, suffix: int, turn: int, ttft: float, reuse: str, gap: float) -> None:
        rec = record(leg, prefix, turn, ttft, reuse=reuse)
        rec.start_time_ms, rec.latency_ms, rec.suffix_tokens = self.t, ttft + 100, suffix
        rec.input_num_tokens, rec.reused_tokens = prefix + suffix * turn, prefix + suffix * (turn - 1)
        self.records.append(rec)
        if self.with_streams:  # a stream decoding all along the turn, one token every `gap` ms
            times = [self.t + i * gap for i in range(int(rec.latency_ms / gap) + 1)]
            self.streams.append(StreamRecord(0, len(self.streams), leg, self.t - 1, times))
        self.t += rec.latency_ms + 50

    def write(self, out: Path) -> Path:
        for leg in ("dp", "local"):
            write_records(out / f"records-{leg}.json", [r for r in self.records if r.leg == leg])
            if self.with_streams:
                write_streams(out / f"background-{leg}.json", [s for s in self.streams if s.leg == leg])
        return out


def _sweep(ratios: dict[int, float], rises: dict[tuple[int, int], float] | None = None, **kw: bool) -> Run:
    run = Run(**kw)
    for prefix in HISTORIES:
        for suffix in SUFFIXES:
            run.point(prefix, suffix, ratios[suffix], (rises or {}).get((prefix, suffix), 0.0))
    return run


def _choice(run: Run, targets: Targets = ISSUE_TARGETS) -> tuple[int, list[str]]:
    choice = choose_threshold(compare(point_stats(run.records, run.streams)), targets)
    return choice.threshold, choice.why


RATIOS = {128: 0.4, 512: 0.5, 1024: 0.65, 2048: 0.8}


def test_the_threshold_is_the_largest_suffix_whose_turns_are_fast_enough_locally() -> None:
    threshold, why = _choice(_sweep(RATIOS))
    assert threshold == 1024
    assert "`router.decodeLocalMaxTokens: 1024`" in why[0] and "(8000, 16000 tokens)" in why[0]
    assert why[1] == "It stops below 2048 tokens of suffix on 8000 tokens of history: local/D->P 0.80 > 0.70."
    assert "Suffixes of at most 1024 tokens: local TTFT p50 at most 0.70x D->P's at 6 of 6 points." in why


def test_a_tpot_rise_over_ten_percent_at_one_history_length_lowers_the_threshold_for_all() -> None:
    threshold, why = _choice(_sweep(RATIOS, {(16000, 1024): 0.15, (8000, 512): 0.08}))
    assert threshold == 512
    assert "on 16000 tokens of history: TPOT p90 +15% > 10%" in why[1]
    assert (
        "At 8000 tokens of history alone: up to 1024." in why and "At 16000 tokens of history alone: up to 512." in why
    )


def test_a_point_that_passes_again_above_a_failing_one_does_not_raise_the_threshold() -> None:
    threshold, _ = _choice(_sweep({128: 0.4, 512: 0.75, 1024: 0.6, 2048: 0.6}))
    assert threshold == 128


def test_other_targets_move_the_threshold_with_the_same_numbers() -> None:
    run = _sweep(RATIOS)
    assert _choice(run, Targets(ttft_ratio=0.9))[0] == 2048
    assert _choice(run, Targets(ttft_ratio=0.45))[0] == 128


def test_a_local_leg_the_router_did_not_serve_locally_supports_no_threshold() -> None:
    run = Run()
    for prefix in HISTORIES:
        run.point(prefix, 128, 0.5, local_turns=0)  # e.g. decodeLocalMaxBusy under the streams' count
    threshold, why = _choice(run)
    assert threshold == 0 and why[0].startswith("Default: decode-local off (`router.decodeLocalMaxTokens: 0`)")
    assert (
        why[1] == "The shortest fails, 128 tokens of suffix on 8000 tokens of history: served locally in 0 of 2 turns."
    )


def test_without_background_streams_the_choice_says_it_rests_on_ttft_alone() -> None:
    threshold, why = _choice(_sweep(RATIOS, streams=False))
    assert threshold == 1024
    assert "TPOT p90" not in why[0]
    assert why[-1].startswith("TPOT was not measured at every point")


def test_the_report_has_a_table_per_history_length_and_the_chosen_threshold(tmp_path: Path) -> None:
    run = _sweep(RATIOS, {(8000, 2048): 0.2})
    choice, files = write_report(run.write(tmp_path))
    md = files["report"].read_text()
    assert "decode-local" in md and choice.threshold == 1024 and choice.why[0] in md
    assert "## 8000 tokens of history" in md and "## 16000 tokens of history" in md
    row = "| 1024 | 1024 | 200 / 200 | 130 / 130 | 0.65x | 2/2 | 5.00 | 5.00 (+0%) | +0% .. +0% | 5.0 / 5.0 |"
    assert f"{row} meets both |" in md
    assert "| 2048 | 2048 | 200 / 200 | 160 / 160 | 0.80x | 2/2 | 5.00 | 6.00 (+20%) | +20% .. +20% | 5.0 / 6.0 |" in md
    data = files["json"].read_text()
    assert '"threshold": 1024' in data


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    cli.add_parser(p.add_subparsers())
    return p.parse_args(["bench", *argv])


def test_the_subcommand_writes_the_report_beside_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _sweep(RATIOS).write(tmp_path)
    args = _args("report-decode-local", str(tmp_path), "--ttft-target", "0.55")
    assert args.run(args) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("Default threshold: `router.decodeLocalMaxTokens: 512`")
    assert (tmp_path / "decode-local.md").is_file()


def test_the_subcommand_refuses_a_directory_without_the_legs_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _args("report-decode-local", str(tmp_path))
    assert args.run(args) == 2
    assert "records-dp.json" in capsys.readouterr().err


def _noisy(n: int, scale: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [scale * (6.0 + rng.uniform(-1.0, 1.0)) for _ in range(n)]


def test_the_rise_interval_holds_no_rise_for_two_samples_of_one_distribution() -> None:
    lo, hi = rise_interval(_noisy(30, 1.0, 1), _noisy(30, 1.0, 2))
    assert lo < 0 < hi and hi - lo > 0.05
    assert rise_interval(_noisy(30, 1.0, 1), _noisy(30, 1.0, 2)) == (lo, hi)  # seeded


def test_the_rise_interval_excludes_the_target_for_a_clear_rise() -> None:
    lo, hi = rise_interval(_noisy(200, 1.0, 1), _noisy(200, 1.3, 2))
    assert 0.10 < lo < hi and abs((lo + hi) / 2 - 0.30) < 0.05


def test_the_threshold_reasons_count_the_points_whose_interval_holds_the_target() -> None:
    _, why = _choice(_sweep(RATIOS, {(8000, 2048): 0.2}))
    points = len(HISTORIES) * len(SUFFIXES)
    assert f"At 0 of {points} points the TPOT rise's 90% interval holds 10%" in " ".join(why)
