"""`pdx bench wave-report OUT`: one report.md over a wave's parts (pure, reads OUT).

The seed article (1P1D on two p5en.48xlarge, Qwen3-32B at TP 8, EFA between them) gives its
TTFT as means per prompt length, and states two ends of its sweep: OFF 158 ms at 2k and 778 ms
at 24k, ON 122 and 460 ms. The wave's sweep is put beside them as means too (follow-up turns),
with its p50, the bound and the ratios; what differs (model, parallelism, GPUs, the interconnect)
is said above the table.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import wavetargets
from .records import RequestRecord, read_records, stored
from .report import INTERVAL, cell, markdown, percentile, ratio_interval, ratio_interval_cell

# The seed's Qwen3-32B figures (ms, means over follow-up turns per prompt length), as its text
# states them: TTFT OFF and ON, and the prefill time (compute + D->P transfer for ON).
SEED_P5EN: dict[int, dict[str, float]] = {
    2000: {"off": 158.0, "on": 122.0, "prefill_off": 153.0, "prefill_on": 128.0},
    24000: {"off": 778.0, "on": 460.0, "prefill_off": 744.0, "prefill_on": 414.0},
}
SEED_SETUP = "1P1D, two p5en.48xlarge (8 H200 each), Qwen3-32B at TP 8, KV over EFA; prefill's prefix cache off"


def _records(part: Path, leg: str) -> list[RequestRecord]:
    path = stored(part / f"records-{leg}.json")
    return read_records(path) if path is not None else []


def _summary(part: Path) -> dict[str, Any] | None:
    path = part / "summary.json"
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _p50(values: Sequence[float]) -> float | None:
    return percentile(values, 50) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def seed_table(sweep: Path) -> tuple[str, dict[str, Any]]:
    """The sweep's follow-up turns per length beside the seed's p5en figures, and ON's first turn
    against OFF's (issue 43's target: at most 1.03x)."""
    legs = {leg: _records(sweep, leg) for leg in ("off", "on", "bound")}
    lengths = sorted({r.prefix_tokens for rs in legs.values() for r in rs} | set(SEED_P5EN))
    rows, data = [], []
    for n in lengths:
        follow = {leg: [r.ttft_ms for r in rs if r.prefix_tokens == n and r.turn >= 2] for leg, rs in legs.items()}
        first = {leg: [r.ttft_ms for r in rs if r.prefix_tokens == n and r.turn == 1] for leg, rs in legs.items()}
        prompt = _mean([float(r.input_num_tokens) for r in legs["on"] if r.prefix_tokens == n and r.turn >= 2])
        seed = SEED_P5EN.get(n, {})
        row: dict[str, Any] = {
            "length": n,
            "prompt_tokens": prompt,
            "seed_off_mean": seed.get("off"),
            "seed_on_mean": seed.get("on"),
            "seed_off_over_on": _ratio(seed.get("off"), seed.get("on")),
            "off_mean": _mean(follow["off"]),
            "on_mean": _mean(follow["on"]),
            "off_p50": _p50(follow["off"]),
            "on_p50": _p50(follow["on"]),
            "bound_p50": _p50(follow["bound"]),
            "first_on_over_off": _ratio(_p50(first["on"]), _p50(first["off"])),
            "first_on_over_off_90": list(ratio_interval(first["on"], first["off"])),
        }
        row["off_over_on"] = _ratio(row["off_mean"], row["on_mean"])
        row["on_over_bound"] = _ratio(row["on_p50"], row["bound_p50"])
        data.append(row)
        rows.append(
            (
                str(n), cell(prompt), cell(row["seed_off_mean"]), cell(row["seed_on_mean"]),
                cell(row["seed_off_over_on"], "{:.2f}x"), cell(row["off_mean"]), cell(row["on_mean"]),
                cell(row["off_over_on"], "{:.2f}x"), cell(row["off_p50"]), cell(row["on_p50"]), cell(row["bound_p50"]),
                cell(row["on_over_bound"], "{:.2f}x"), cell(row["first_on_over_off"], "{:.3f}x"),
                ratio_interval_cell(row["first_on_over_off_90"]),
            )
        )  # fmt: skip
    headers = (
        "prefix", "prompt tok", "seed OFF mean", "seed ON mean", "seed OFF/ON", "OFF mean", "ON mean", "OFF/ON",
        "OFF p50", "ON p50", "bound p50", "ON/bound", "turn 1 ON/OFF", f"its {INTERVAL:.0%}",
    )  # fmt: skip
    on = {r["length"]: r["on_p50"] for r in data}
    growth = _ratio(on.get(24000), on.get(8000))
    text = markdown(headers, rows)
    text += (
        f"\n\nThe seed: {SEED_SETUP}; its text gives the 2k and 24k ends (means). Here: follow-up turns (turn >= 2), "
        f"ms; turn 1 ON/OFF: first turns' p50, ON over OFF (target at most {wavetargets.FIRST_TURN}x), "
        f"and its {INTERVAL:.0%} bootstrap "
        "interval (a p50 of a few first turns moves several percent between runs). "
        f"ON p50 growth from 8k to 24k: {cell(growth, '{:.2f}x')} (target at most {wavetargets.GROWTH}x)."
    )
    return text, {"rows": data, "on_growth_8k_24k": growth}


def _rows_table(summary: dict[str, Any]) -> str:
    """OFF, ON and the bound per prefix; with a `dp` leg (ON through prefill, decode-local off),
    the D->P path over the same bound too, and so each other `dp-*` leg (a variant of that path)."""
    headers: tuple[str, ...] = ("prefix", "OFF p50", "OFF p90", "ON p50", "ON p90", "OFF/ON", "bound p50", "ON/bound")
    points = summary.get("points", [])
    dp_legs = list(
        dict.fromkeys(p["leg"] for p in points if p.get("leg") == "dp" or p.get("leg", "").startswith("dp-"))
    )
    dps = {leg: {p["prefix_tokens"]: p for p in points if p.get("leg") == leg} for leg in dp_legs}
    for leg in dp_legs:
        name = "D->P" if leg == "dp" else leg
        headers += (f"{name} p50", f"{name}/bound")
    body = []
    for r in summary.get("rows", []):
        off, on, bound = r.get("off") or {}, r.get("on") or {}, r.get("bound") or {}
        row: tuple[str, ...] = (
            str(r["length"]), cell(off.get("ttft_p50")), cell(off.get("ttft_p90")), cell(on.get("ttft_p50")),
            cell(on.get("ttft_p90")), cell(r.get("ratio"), "{:.2f}x"), cell(bound.get("ttft_p50")),
            cell(r.get("on_over_bound"), "{:.2f}x"),
        )  # fmt: skip
        for dp in dps.values():
            p50 = (dp.get(r["length"]) or {}).get("ttft_p50")
            row += (cell(p50), cell(_ratio(p50, bound.get("ttft_p50")), "{:.2f}x"))
        body.append(row)
    return markdown(headers, body)


def _agentic_table(summary: dict[str, Any]) -> str:
    block = summary.get("agentic")
    if not block:
        return "(no agentic rows)"
    headers = (
        "leg",
        "bucket",
        "n",
        "local",
        "D->P",
        "recompute",
        "released",
        "ON p50",
        "OFF p50",
        "bound p50",
        "ON/bound",
    )
    body = []
    for r in block["rows"]:
        o = r["outcomes"]
        body.append(
            (
                r["leg"], r["bucket"], str(r["n"]), str(o["local"]), str(o["D->P"]), str(o["recompute"]),
                str(o["released"]), cell(r["ttft_p50"]), cell(r["off_p50"]), cell(r["bound_p50"]),
                cell(r["on_over_bound"], "{:.2f}x"),
            )
        )  # fmt: skip
    return markdown(headers, body) + f"\n\n{block['mix']}"


def _points_table(summary: dict[str, Any]) -> str:
    headers = ("leg", "prefix", "live", "n", "p50", "p90", "p99", "outcomes", "overcommit", "released/waited/lapsed")
    body = []
    for p in summary.get("points", []):
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(p["outcomes"].items()))
        lapsed = cell(p.get("lapsed_claims"))
        held = "-" if p.get("releases") is None else f"{p['releases']}/{p['waited_on_held']}/{lapsed}"
        body.append(
            (
                p["leg"], str(p["prefix_tokens"]), cell(p.get("live")), str(p["n"]), cell(p["ttft_p50"]),
                cell(p["ttft_p90"]), cell(p.get("ttft_p99")), outcomes, cell(p.get("overcommit"), "{:.1f}x"), held,
            )
        )  # fmt: skip
    return markdown(headers, body)


SECTIONS = (
    ("suffix2k", f"2k-token suffixes: ON and the D->P path over the bound (target at most {wavetargets.BOUND}x)"),
    ("agentic", "The agentic mix: outcomes and ON/bound per suffix bucket"),
    ("load", "Load: 8 clients, OFF and ON"),
    ("overcommit", "One overcommit point: held KV over decode's cache, the valve on"),
    ("first", "Prefill's first token: the D->P path with decode's and with prefill's first token"),
)


def write(out: Path) -> Path:
    """OUT/report.md and OUT/report.json from whatever parts OUT holds."""
    status = json.loads((out / "wave.json").read_text()) if (out / "wave.json").is_file() else {}
    gpu = (out / "gpu.txt").read_text().strip() if (out / "gpu.txt").is_file() else "(no gpu.txt)"
    lines = ["# pdx wave: every GPU figure in one run", "", "## Machine", "", "```", gpu, "```", ""]
    if (out / "plan.txt").is_file():
        lines += ["```", (out / "plan.txt").read_text().strip(), "```", ""]
    at = len(lines)  # the targets go here, once the sweep's table is known
    steps = status.get("steps", [])
    if steps:
        body = [
            (
                s["part"], s["leg"], cell(s.get("estimate_s")), cell(s.get("seconds")),
                "kept" if s.get("engines_kept") else ("started" if "seconds" in s else "-"),
                s.get("skipped") or s.get("error", "")[:80] or ("complete" if s.get("complete") else "partial"),
            )
            for s in steps
        ]  # fmt: skip
        lines += ["## What ran", "", markdown(("part", "leg", "estimate s", "took s", "engines", "state"), body)]
        lines += ["", f"Wave: {cell(status.get('seconds'))} s of {cell(status.get('plan', {}).get('budget_s'))} s.", ""]
    data: dict[str, Any] = {}
    if (out / "sweep").is_dir():
        text, data["sweep"] = seed_table(out / "sweep")
        lines += ["## The seed's sweep, beside the seed's p5en figures", "", text, ""]
        if (out / "sweep" / "ttft_vs_prompt_length.png").is_file():
            lines += ["![TTFT vs prompt length](sweep/ttft_vs_prompt_length.png)", ""]
    targets = wavetargets.verdicts(out, data.get("sweep"))
    lines[at:at] = [
        "## Targets",
        "",
        wavetargets.markdown_table(targets),
        "",
        "Judged from the parts' files (`pdx_bench.wavetargets`); `-`: the part did not run or lacks the "
        "figure. The run's own time (machine start, staging and install included, at most 25 minutes) is "
        "outside what the wave sees: `session.log` of `scripts/gpu-wave.sh` has it.",
        "",
    ]
    data["targets"] = wavetargets.to_json(targets)
    for name, heading in SECTIONS:
        summary = _summary(out / name)
        if summary is None:
            continue
        table = (
            _agentic_table(summary)
            if name == "agentic"
            else _points_table(summary)
            if name in ("overcommit", "first")
            else _rows_table(summary)
        )
        legs = summary.get("context", {}).get("wave legs run", "")
        lines += [f"## {heading}", "", table, "", f"Legs run: {legs}. Details: `{name}/report.md`.", ""]
    if (out / "tpot" / "decode-local.md").is_file():
        lines += ["## Decode-local: the streams' TPOT", "", "See `tpot/decode-local.md`:", ""]
        lines += [line for line in (out / "tpot" / "decode-local.md").read_text().splitlines() if line.strip()][:40]
        lines.append("")
    correct = out / "correct" / "summary.md"
    if correct.is_file():
        lines += ["## Correctness (scripts/gpu-correct.sh)", "", correct.read_text().strip(), ""]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    (out / "report.json").write_text(json.dumps(data, indent=2) + "\n")
    return path
