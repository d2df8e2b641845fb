"""Table numbers, plots and the Markdown report from synthetic records."""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pdx_bench.report import format_table, percentile, ratio_interval, summarize, ttft_series, write_report

from .synth import sweep_records

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    return w, h


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_matches_numpy(q: float) -> None:
    values = [3.0, 1.0, 7.5, 2.0, 10.0, 4.0]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_summary_numbers() -> None:
    rows = summarize(sweep_records())
    assert [r.length for r in rows] == [1000, 4000]
    short, long = rows
    assert short.off is not None and short.on is not None and long.off is not None and long.on is not None
    # Turn 1 (TTFT 9999) is left out: only follow-up turns can reuse anything.
    assert short.off.n == 4 and short.on.n == 4
    assert short.off.ttft_p50 == pytest.approx(115.0)
    assert short.off.ttft_p90 == pytest.approx(127.0)
    assert short.on.ttft_p50 == pytest.approx(65.0)
    assert long.off.ttft_p50 == pytest.approx(550.0)
    assert long.on.ttft_p50 == pytest.approx(150.0)
    assert long.on.ttft_p90 == pytest.approx(270.0)
    assert short.ratio == pytest.approx(115 / 65)
    assert long.ratio == pytest.approx(550 / 150)
    assert long.on.hit_rate == pytest.approx(0.75)
    assert long.off.hit_rate == 0.0
    assert long.on.kv_transfer_ms == pytest.approx(3.75)  # (5+5+5+0)/4
    assert long.on.prefill_ms == pytest.approx((90 + 90 + 190 + 290) / 4)
    # The bound: its own leg, its median beside ON's.
    assert short.bound is not None and long.bound is not None
    assert short.bound.n == 4 and short.bound.ttft_p50 == pytest.approx(45.0)
    assert short.on_over_bound == pytest.approx(65 / 45)
    assert long.on_over_bound == pytest.approx(150 / 75)


def test_terminal_table_shows_the_numbers() -> None:
    text = format_table(summarize(sweep_records()))
    lines = text.splitlines()
    assert "OFF p50" in lines[0] and "ON hit rate" in lines[0]
    last = lines[-1].split()
    assert last[0] == "4000"
    assert last[3:] == ["550", "670", "150", "270", "3.67x", "75%", "75", "2.00x"]
    assert lines[0].split()[-2:] == ["p50", "ON/bound"]


def test_report_files(tmp_path: Path) -> None:
    rows, files = write_report(sweep_records(), tmp_path, context={"target": "synthetic"}, notes=["a note"])
    assert len(rows) == 2
    for key in ("ttft_plot", "prefill_plot"):
        w, h = _png_size(files[key])
        assert w > 300 and h > 200
    md = files["report"].read_text()
    assert "![TTFT vs prompt length](ttft_vs_prompt_length.png)" in md
    assert "![Prefill breakdown](prefill_breakdown.png)" in md
    assert "| 4000 |" in md and "3.67x" in md and "synthetic" in md and "a note" in md


def test_plots_survive_a_missing_leg(tmp_path: Path) -> None:
    only_on = [r for r in sweep_records() if r.leg == "on"]
    rows, files = write_report(only_on, tmp_path)
    assert all(r.off is None and r.bound is None for r in rows)
    assert files["ttft_plot"].read_bytes()[:8] == PNG_MAGIC
    assert format_table(rows).splitlines()[-1].split()[-2:] == ["-", "-"]  # no bound: blank, not 0
    assert [s.label for s in ttft_series(rows)] == ["bidirectional ON"]


def test_the_ttft_plot_draws_the_bound_as_a_third_line() -> None:
    lines = ttft_series(summarize(sweep_records()))
    assert [s.label.split(":")[0] for s in lines] == ["bidirectional OFF", "bidirectional ON", "bound"]
    bound = lines[2]
    assert bound.p50 == pytest.approx([45.0, 75.0]) and len(bound.xs) == 2


def test_a_leg_s_hit_rate_counts_turns_prefilled_on_the_decode_that_held_them() -> None:
    records = [replace(r, reuse="local") if r.reuse == "hit" else r for r in sweep_records()]
    long = summarize(records)[1]
    assert long.on is not None and long.on.hit_rate == pytest.approx(0.75)


def test_a_ratio_of_few_values_gets_a_wide_interval_and_many_equal_values_a_point() -> None:
    low, high = ratio_interval([100.0, 104.0, 96.0], [100.0, 110.0, 90.0])
    assert low < 1.0 < high and high - low > 0.05
    assert ratio_interval([103.0] * 30, [100.0] * 30) == pytest.approx((1.03, 1.03))
    assert all(v != v for v in ratio_interval([], [1.0]))  # NaN: nothing to compare
