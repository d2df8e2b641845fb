"""The one-run GPU wave (issues 43 and 45): its plan, the budget arithmetic, and the whole run on
the fake local topology (engine starts, parts packed as they end, a budget that runs out, the
report beside the seed's p5en figures), and scripts/gpu-wave.sh's plan."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from pdx_bench import wave, wavereport
from pdx_bench.cli import max_prompt_tokens
from pdx_bench.records import read_records
from pdx_bench.sweep import only_router_differs
from pdx_bench.workload import WordCounter

from .fakeserver import FakeTopology, example_doc

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_plan_names_every_figure_of_the_wave_and_fits_25_minutes_of_machine() -> None:
    plan = wave.plan("gpu")
    names = [p["name"] for p in plan.to_json()["parts"]]
    assert names == ["sweep", "suffix2k", "agentic", "first", "tpot", "load", "overcommit", "correct"]
    assert plan.budget_s == 25 * 60 - wave.OUTSIDE_S
    steps = plan.steps()
    # every leg of every part runs once; the sweep first and whole, OFF then ON
    assert sorted((s.part, s.leg.name) for s in steps) == sorted(
        (p.name, leg.name) for p in plan.parts for leg in p.legs
    )
    assert [(s.part, s.leg.name) for s in steps[:2]] == [("sweep", "off"), ("sweep", "on")]
    # then every ON-side leg on the engines the sweep left, the OFF legs, then the switch's (decode's
    # logits processor) on engines of their own: four starts in all, each set of engines started once
    assert plan.starts() == 4
    assert [s.leg.name for s in steps if s.start] == ["off", "on", "off", "dp-first"]
    assert "on-shortened" not in [s.leg.name for s in steps]  # only when named: PARTS=...,shortened
    # the arithmetic: legs, the first start and the later ones, correct's reserve, within the budget
    legs = sum(s.estimate_s for s in steps)
    costs = wave.GPU_COSTS
    starts = costs.engine_start_s + 3 * costs.engine_restart_s
    # correct's reserve: its two starts and a third for prefill's first token
    assert plan.estimate_s() == pytest.approx(legs + starts + 1.5 * costs.correct_s)
    assert plan.estimate_s() <= plan.budget_s
    # part after part, OFF then ON, would start the engines thirteen times: over the budget
    assert legs + costs.engine_start_s + 12 * costs.engine_restart_s + 1.5 * costs.correct_s > plan.budget_s


@pytest.mark.parametrize("cr", ["examples/local-gpu.yaml", "examples/local-gpu-tp2.yaml"])
def test_every_part_fits_the_gpu_examples_max_model_len(cr: str) -> None:
    limit = yaml.safe_load((ROOT / cr).read_text())["spec"]["model"]["maxModelLen"]
    for part in wave.plan("gpu").parts:
        assert max_prompt_tokens(part.spec, list(part.lengths), list(part.suffixes)) <= limit, part.name


def test_a_subset_without_the_sweep_starts_each_set_of_engines_once_on_side_first() -> None:
    steps = wave.plan("gpu", ["suffix2k", "agentic"]).steps()
    assert [(s.part, s.leg.name, s.start) for s in steps] == [
        ("suffix2k", "on", True), ("suffix2k", "dp", False), ("agentic", "on", False),
        ("suffix2k", "off", True), ("agentic", "off", False),
    ]  # fmt: skip
    steps = wave.plan("gpu", ["agentic", "load"]).steps()
    assert [(s.part, s.leg.name, s.start) for s in steps] == [
        ("agentic", "on", True), ("load", "on", False), ("agentic", "off", True), ("load", "off", False),
    ]  # fmt: skip


def test_the_estimate_grows_with_the_work_a_leg_does() -> None:
    sweep = wave.plan("gpu").part("sweep")
    off, on = sweep.legs
    assert sweep.estimate_s(off, wave.GPU_COSTS) > 0
    # ON computes only each turn's new tokens, but also serves the bound: both counted
    no_bound = wave.Part(sweep.name, sweep.what, sweep.legs, sweep.lengths, sweep.spec, bound=False)
    assert no_bound.estimate_s(on, wave.GPU_COSTS) < no_bound.estimate_s(off, wave.GPU_COSTS)
    assert sweep.estimate_s(on, wave.GPU_COSTS) > no_bound.estimate_s(on, wave.GPU_COSTS)


def test_a_subset_and_unknown_parts() -> None:
    plan = wave.plan("gpu", ["load", "sweep"])
    assert [p.name for p in plan.parts] == ["sweep", "load"] and not plan.correct
    with pytest.raises(ValueError, match="unknown parts nope"):
        wave.plan("gpu", ["nope"])


def test_the_wave_resource_fixes_decodes_kv_blocks_and_turns_bidirectional_on() -> None:
    doc = yaml.safe_load((ROOT / "examples/local-gpu-overcommit.yaml").read_text())
    doc["spec"]["kvTransfer"]["bidirectional"] = False
    got = wave.wave_document(doc, 512)
    assert got["spec"]["decode"]["extraArgs"] == ["--num-gpu-blocks-override", "512"]
    assert got["spec"]["kvTransfer"]["bidirectional"] is True
    assert "extraArgs" not in wave.wave_document(example_doc(), None)["spec"]["decode"]


def _run(
    tmp_path: Path,
    budget_s: float = 3600.0,
    parts: list[str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[wave.Plan, int]:
    plan = wave.plan("cpu", parts or list(wave.PART_NAMES), budget_s)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "gpu.txt").write_text("name, memory.total [MiB]\nNVIDIA H100 80GB HBM3, 81559 MiB\n")
    logs = tmp_path / "state" / "logs"
    logs.mkdir(parents=True)
    (logs / "ipc-probe.log").write_text("pdx-ipc-probe: cuda READ 256 MiB at 1294.9 GB/s over cuda_ipc\n")
    doc = wave.wave_document(example_doc(), 24)
    rc = wave.run(
        plan,
        doc,
        tmp_path / "out",
        lambda _ep: WordCounter(),
        factory=FakeTopology,
        log_dirs=lambda: iter([logs]),
        clock=clock,
    )
    return plan, rc


def test_the_whole_wave_on_fakes_four_engine_starts_each_part_packed_and_reported(tmp_path: Path) -> None:
    plan, rc = _run(tmp_path)
    out = tmp_path / "out"
    assert rc == 0, (out / "wave.log").read_text()
    # the engines started as planned: OFF, ON, OFF, ON with prefill's first token; every other leg
    # kept the running ones
    assert [d["spec"]["kvTransfer"]["bidirectional"] for d in FakeTopology.started] == [False, True, False, True]
    first = [d["spec"].get("router", {}).get("firstTokenFromPrefill") for d in FakeTopology.started]
    assert first == [None, None, None, True]
    assert all(d["spec"]["decode"]["extraArgs"] == ["--num-gpu-blocks-override", "24"] for d in FakeTopology.started)
    status = json.loads((out / "wave.json").read_text())
    assert [(s["part"], s["leg"]) for s in status["steps"]] == [(s.part, s.leg.name) for s in plan.steps()]
    assert [s["engines_kept"] for s in status["steps"]] == [not s.start for s in plan.steps()]
    for part in plan.parts:
        legs = {leg.name for leg in part.legs} | ({"bound"} if part.bound else set())
        assert {
            p.name.removeprefix("records-").removesuffix(".json") for p in (out / part.name).glob("records-*")
        } == legs
        assert all(read_records(out / part.name / f"records-{leg}.json") for leg in legs)
        with tarfile.open(out / f"{part.name}.tgz") as tar:
            names = tar.getnames()
        assert f"{part.name}/report.md" in names and f"{part.name}/wave.json" in names
        assert f"{part.name}/logs/ipc-probe.log" in names and f"{part.name}/gpu.txt" in names
    # the tpot part went local on its local leg, and got decode-local's report
    local = [r for r in read_records(out / "tpot" / "records-local.json") if r.turn >= 2]
    assert local and {r.reuse for r in local} == {"local"}
    assert (out / "tpot" / "decode-local.md").is_file()
    summary = json.loads((out / "agentic" / "summary.json").read_text())
    assert {r["leg"] for r in summary["agentic"]["rows"]} == {"on"} and summary["agentic"]["rows"][-1]["off_n"] > 0
    assert json.loads((out / "overcommit" / "summary.json").read_text())["points"][0]["live"] == 3
    log = (out / "wave.log").read_text()
    assert "sweep on: exit 0" in log and "suffix2k on: exit 0" in log and "(partial: on)" in log
    # the report: what ran, the sweep beside the seed's p5en figures, every part's table
    report = wavereport.write(out).read_text()
    assert "NVIDIA H100 80GB HBM3" in report and "## What ran" in report
    assert "| 24000 | - | 778 | 460 | 1.69x |" in report  # the seed's end, where this run had no 24k point
    for heading in ("2k-token suffixes", "The agentic mix", "Load: 8 clients", "One overcommit point", "Decode-local"):
        assert heading in report
    suffix2k = report.split("## 2k-token suffixes")[1].split("##")[0]
    assert "| bound p50 | ON/bound | D->P p50 | D->P/bound |" in suffix2k, suffix2k
    assert not re.search(r"\| - \| - \|\n", suffix2k), suffix2k
    # every target judged from the parts' files; the fakes ran no correctness check, so that one is not judged
    targets = {t["target"]: t for t in json.loads((out / "report.json").read_text())["targets"]}
    assert len(targets) == 13 and "## Targets" in report.split("## What ran")[0]  # 4 of part first
    assert targets["gpu-correct.sh with the defaults"]["met"] is None
    judged = [t for t in targets.values() if t["met"] is not None]
    assert len(judged) >= 5, targets
    rows = json.loads((out / "report.json").read_text())["sweep"]["rows"]
    mine = next(r for r in rows if r["length"] == 256)
    assert mine["off_mean"] > 0 and mine["on_p50"] > 0 and mine["bound_p50"] > 0 and mine["first_on_over_off"] > 0
    low, high = mine["first_on_over_off_90"]  # the first turns' ratio with its bootstrap interval
    assert low <= mine["first_on_over_off"] <= high


def test_a_budget_that_runs_out_skips_what_would_not_fit_and_keeps_what_ran(tmp_path: Path) -> None:
    plan = wave.plan("cpu", ["sweep", "load"], 10_000)
    first = plan.steps()[0].estimate_s + plan.costs.engine_start_s
    ticks = itertools.count(0, 30)  # each reading of the clock 30 s on: the fakes take no time
    _, rc = _run(tmp_path, budget_s=first + 31, parts=["sweep", "load"], clock=lambda: float(next(ticks)))
    out = tmp_path / "out"
    assert rc == 1
    status = json.loads((out / "wave.json").read_text())
    ran = [(s["part"], s["leg"]) for s in status["steps"] if "seconds" in s]
    skipped = [(s["part"], s["leg"]) for s in status["steps"] if "skipped" in s]
    assert ran == [("sweep", "off")] and skipped == [("sweep", "on"), ("load", "on"), ("load", "off")]
    assert (out / "sweep.tgz").is_file() and not (out / "load").exists()
    assert "sweep on: skipped" in (out / "wave.log").read_text()


def test_the_script_prints_the_plan_without_a_gpu(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    got = subprocess.run(
        ["bash", "scripts/gpu-wave.sh", "--plan"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert got.returncode == 0, got.stderr
    plan = json.loads(got.stdout[got.stdout.index("{") :])
    assert [p["name"] for p in plan["parts"]][-1] == "correct" and plan["estimate_s"] <= plan["budget_s"]
    cpu = subprocess.run(
        ["bash", "scripts/gpu-wave.sh", "--plan"],
        cwd=ROOT,
        env={**env, "PROFILE": "cpu", "BUDGET_S": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cpu.returncode == 1 and "the plan needs" in cpu.stderr


def test_with_every_part_the_switchs_engines_start_before_the_shortened_holds_comparison() -> None:
    """A wave short of time skips from the end: the comparison leg goes before part `first`'s."""
    every = [*wave.PART_NAMES, *wave.OPTIONAL_PARTS, wave.CORRECT]
    steps = wave.plan("gpu", every).steps()
    assert [(s.part, s.leg.name) for s in steps][-4:] == [
        ("first", "dp-first"),
        ("first", "on-first"),
        ("tpot", "dp-first"),  # the switch's streams: after part first's legs on the same engines
        ("overcommit", "on-shortened"),
    ]
    assert [s.leg.name for s in steps].count("on-first") == 1


def test_the_shortened_holds_leg_is_asked_for_with_overcommit_and_refused_without_it() -> None:
    legs = [leg.name for leg in wave.plan("gpu", ["overcommit", "shortened"]).part("overcommit").legs]
    assert legs == ["on", "on-shortened", "off"]
    assert [leg.name for leg in wave.plan("gpu", ["overcommit"]).part("overcommit").legs] == ["on", "off"]
    with pytest.raises(ValueError, match="name both"):
        wave.plan("gpu", ["sweep", "shortened"])


def test_the_first_token_part_starts_decodes_processor_its_own_engines() -> None:
    steps = wave.plan("gpu", ["first"]).steps()
    assert [(s.leg.name, s.start) for s in steps] == [
        ("on", True),
        ("dp", False),
        ("dp-first", True),
        ("on-first", False),  # the switch's engines, the default router fields
    ]
    on = {"spec": {"kvTransfer": {"bidirectional": True}, "router": {"decodeLocalMaxTokens": 0}}}
    first = {"spec": {"kvTransfer": {"bidirectional": True}, "router": {"firstTokenFromPrefill": True}}}
    assert only_router_differs(on, {"spec": {**on["spec"], "router": {"reuseHeaders": True}}})
    assert not only_router_differs(on, first)  # decode's arguments follow this router field
