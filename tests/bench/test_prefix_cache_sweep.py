"""The live sweep (issue 34): conversations live at once, prefill's prefix cache under pressure,
where each follow-up's tokens came from, and the report that puts the legs side by side."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from pdx_bench import cli, prefixcache
from pdx_bench.enginemetrics import kv_capacity, parse_sources, sources
from pdx_bench.points import point_stats
from pdx_bench.sweep import Leg, LocalTarget, Point, SweepConfig, run_sweep, total_requests
from pdx_bench.workload import WordCounter, WorkloadSpec

from .fakeserver import EXAMPLE, FakeTopology, example_doc

AFFINE_CACHE = (("prefill.prefixCaching", True), ("router.prefillAffinity", True))
CACHE = Leg("cache", (("kvTransfer.bidirectional", False), *AFFINE_CACHE))
ON_CACHE = Leg("bidir-cache", (("kvTransfer.bidirectional", True), *AFFINE_CACHE))
SPEC = WorkloadSpec(
    turns=3, user_tokens=8, tool_tokens=24, output_tokens=4, think_time_s=0.05, shared_prefix=False
)


def _config(*legs: Leg, live: list[int]) -> SweepConfig:
    return SweepConfig(lengths=[100], spec=SPEC, legs=list(legs), bound=False, live=live)


def test_a_live_point_runs_that_many_conversations_at_once_each_on_its_own_client_their_starts_spread() -> None:
    cfg = _config(CACHE, live=[1, 4])
    assert total_requests(cfg) == (1 + 4) * SPEC.turns
    [leg] = run_sweep(LocalTarget(example_doc(), factory=FakeTopology), cfg, lambda ep: WordCounter())
    assert {r.live_conversations for r in leg.records} == {1, 4}
    four = [r for r in leg.records if r.live_conversations == 4]
    assert len(four) == 4 * SPEC.turns and len({r.conversation_id for r in four}) == 4
    assert {r.client_id for r in four} == {0, 1, 2, 3}
    starts = [r.start_time_ms for r in sorted(four, key=lambda r: r.client_id) if r.turn == 1]
    assert starts == sorted(starts)  # client i starts i/4 of a think time late
    assert starts[-1] - starts[0] >= 0.9 * SPEC.think_time_s * 3 / 4 * 1000
    # ...and they overlap: the second conversation starts before the first one ends
    first = [r for r in four if r.client_id == 0]
    assert starts[1] < max(r.start_time_ms + r.latency_ms for r in first)
    assert set(leg.points) == {Point(100, None, 1), Point(100, None, 4)}


def test_each_live_point_sends_other_texts_so_no_cache_holds_a_point_before_it() -> None:
    # Greedy answers repeat too: a point's conversation equal to one before it would find its
    # whole history in prefill's cache, first turn included.
    run_sweep(LocalTarget(example_doc(), factory=FakeTopology), _config(CACHE, live=[1, 2]), lambda ep: WordCounter())
    [router] = FakeTopology.routers
    firsts: dict[str, set[str]] = {"-l1-": set(), "-l2-": set()}
    for body in router.bodies:
        conv = str(body["conversation_id"])
        for point, texts in firsts.items():
            if point in conv and len(body["messages"]) == 2:
                texts.add(body["messages"][0]["content"])
    assert len(firsts["-l1-"]) == 1 and len(firsts["-l2-"]) == 2
    assert firsts["-l1-"].isdisjoint(firsts["-l2-"])


def test_past_prefill_capacity_the_cache_leg_computes_what_was_evicted_and_on_reads_it_from_decode() -> None:
    # Each conversation's last prompt is ~150-250 words; prefill holds 400: two fit, six do not.
    FakeTopology.prefill_capacity = 400
    cfg = _config(CACHE, ON_CACHE, live=[1, 6])
    results = run_sweep(LocalTarget(example_doc(), factory=FakeTopology), cfg, lambda ep: WordCounter())
    assert [leg.capacity for leg in results] == [{"decode": [None], "prefill": [400]}] * 2  # decode's unsaid
    engines = {(leg.leg, p.length, p.suffix, p.live): g for leg in results for p, g in leg.points.items()}
    records = [r for leg in results for r in leg.records]
    stats = {(p.leg, p.live): p for p in point_stats(records, engines=engines)}
    calm, pressed = stats[("cache", 1)].sources, stats[("cache", 6)].sources
    assert calm is not None and pressed is not None
    assert calm.share(calm.local) > 0.6 and calm.remote == 0  # one conversation: its history stays cached
    assert pressed.local == 0 and pressed.share(pressed.computed) > 0.9  # six evict each other: all recomputed
    on = stats[("bidir-cache", 6)].sources
    assert on is not None and on.local == 0 and on.share(on.remote) > 0.6  # decode still holds each one
    assert stats[("bidir-cache", 6)].outcomes == {"hit": 6 * (SPEC.turns - 1)}
    # the follow-ups' tokens: every prompt token of turns >= 2, by source
    six = [r for r in records if r.leg == "cache" and r.live_conversations == 6]
    followups = sum(r.input_num_tokens for r in six if r.turn > 1)
    assert pressed.total == followups


VLLM_METRICS = """# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="pdx-tiny",source="local_compute"} 2816.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="pdx-tiny",source="local_cache_hit"} 1024.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="pdx-tiny",source="external_kv_transfer"} 512.0
vllm:prompt_tokens_by_source_total{engine="1",model_name="pdx-tiny",source="local_compute"} 100.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",num_gpu_blocks="32"} 1.0
"""


def test_prompt_sources_and_kv_capacity_are_read_as_vllm_exports_them() -> None:
    got = sources(parse_sources(VLLM_METRICS))
    assert got == {"local_cache_hit": 1024.0, "external_kv_transfer": 512.0, "local_compute": 2916.0}
    assert kv_capacity(VLLM_METRICS) == 32 * 128
    assert sources(parse_sources("vllm:num_requests_running 0\n")) is None
    assert kv_capacity("vllm:num_requests_running 0\n") is None


def _point(leg: str, live: int, p50: float) -> dict[str, Any]:
    return {
        "leg": leg, "prefix_tokens": 1024, "suffix_tokens": None, "live": live, "n": 6, "ttft_p50": p50,
        "ttft_p90": p50 * 1.5, "outcomes": {"miss": 6}, "sources": {"local": 0, "remote": 0, "computed": 100},
    }  # fmt: skip


def _summary(topology: str, curves: dict[str, list[float]], lives: tuple[int, ...] = (1, 2, 4, 8)) -> dict[str, Any]:
    points = [_point(leg, live, p50) for leg, ys in curves.items() for live, p50 in zip(lives, ys, strict=True)]
    return {"context": {"topology": topology}, "capacity": {"cache": {"prefill": [3968]}}, "points": points}


def test_the_crossing_is_the_first_live_count_from_which_on_stays_ahead_of_the_default() -> None:
    run = prefixcache.run_from_summary(
        "r",
        _summary(
            "1P1D",
            {"cache": [100, 120, 300, 400], "bidir": [110, 115, 150, 160], "bidir-cache": [100, 118, 140, 170]},
        ),
    )
    assert prefixcache.gain(run, 1) == pytest.approx(1.0)
    assert prefixcache.gain(run, 4) == pytest.approx(300 / 140)
    assert prefixcache.crossing(run) == 4  # at 2, 120/115 is within the noise
    assert prefixcache.prefill_cache_under_on([run]) == (2, 1, 1)  # 100/110, 140/150 lower; 170/160 higher
    lines = prefixcache.findings([run])
    assert any("from 4 live conversations on" in line for line in lines)
    assert any("1.00x at 1" in line and "2.14x at 4" in line for line in lines)


def test_a_run_where_on_never_stays_ahead_says_so() -> None:
    late = {"cache": [100.0, 100, 100, 300], "bidir": [100.0, 99, 100, 100]}
    run = prefixcache.run_from_summary("r", _summary("2P1D", late))
    assert prefixcache.crossing(run) == 8
    flat = prefixcache.run_from_summary("r", _summary("2P1D", {"cache": [100.0] * 4, "bidir": [100.0] * 4}))
    assert prefixcache.crossing(flat) is None
    assert any("does not beat OFF+cache" in line for line in prefixcache.findings([flat]))


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    cli.add_parser(p.add_subparsers())
    return p.parse_args(["bench", *argv])


def test_the_cli_sweeps_live_conversations_on_two_prefills_and_the_report_puts_runs_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("pdx_bench.sweep._local_topology", FakeTopology)
    FakeTopology.prefill_capacity = 400
    legs = ("--leg", "cache:kvTransfer.bidirectional=false,prefill.prefixCaching=true,router.prefillAffinity=true",
            "--leg", "bidir:kvTransfer.bidirectional=true,prefill.prefixCaching=false")  # fmt: skip
    workload = ("--lengths", "100", "--turns", "3", "--live", "1,6", "--think-time", "0.05", "--unique-prefix",
                "--user-tokens", "8", "--tool-tokens", "24", "--output-tokens", "4", "--no-bound")  # fmt: skip
    runs = []
    for topology, sets in (("1P1D", ()), ("2P1D", ("--set", "prefill.replicas=2"))):
        out = tmp_path / topology
        args = _args("-f", str(EXAMPLE), "--local", *legs, *workload, *sets, "--out", str(out))
        assert args.run(args) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert summary["context"]["topology"] == topology
        assert summary["capacity"]["cache"]["prefill"] == [400]
        points = {(p["leg"], p["live"]) for p in summary["points"]}
        assert points == {(leg, n) for leg in ("cache", "bidir") for n in (1, 6)}
        assert all(p["sources"] is not None for p in summary["points"])
        runs.append(out)
    assert [d["spec"].get("prefill", {}).get("replicas") for d in FakeTopology.started] == [None, None, 2, 2]
    assert "| cache | 100 | - | 6 |" in (runs[0] / "report.md").read_text()
    capsys.readouterr()
    args = _args("report-prefix-cache", *map(str, runs), "--out", str(tmp_path / "report"))
    assert args.run(args) == 0
    report = (tmp_path / "report" / "prefix-cache.md").read_text()
    assert "## 1P1D: TTFT (ms)" in report and "## 2P1D: where the tokens came from" in report
    assert (tmp_path / "report" / "ttft_vs_live.png").read_bytes().startswith(b"\x89PNG")
    data = json.loads((tmp_path / "report" / "prefix-cache.json").read_text())
    assert [r["topology"] for r in data["runs"]] == ["1P1D", "2P1D"]
    assert "OFF+cache's TTFT p50 over ON's" in capsys.readouterr().out


def test_set_is_for_the_local_resource_only(capsys: pytest.CaptureFixture[str]) -> None:
    args = _args("--url", "http://127.0.0.1:9", "--set", "prefill.replicas=2")
    assert args.run(args) == 2
    assert "--set" in capsys.readouterr().err


def test_the_report_refuses_runs_without_a_live_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "summary.json").write_text(json.dumps({"context": {}, "points": []}))
    args = _args("report-prefix-cache", str(tmp_path), "--out", str(tmp_path / "r"))
    assert args.run(args) == 2
    assert "--live" in capsys.readouterr().err
