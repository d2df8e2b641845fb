"""The decode-local report: short follow-up turns through prefill with a D->P read, against the
same turns prefilled on the decode that holds the conversation, and the threshold
(`router.decodeLocalMaxTokens`) the numbers support.

It reads a `pdx bench` run of two named legs (`--leg dp:router.decodeLocalMaxTokens=0 --leg
local:...`) over `--suffix-tokens` at several `--lengths`, with `--background-streams`. A local
turn is worth it when it is much faster than D->P and does not slow the streams decode is
generating much: issue 33's targets, local TTFT p50 at most 0.7x D->P's and the streams' TPOT
p90 up by at most 10%. A threshold sends every turn up to that many new tokens local, so it is
the largest suffix up to which every point, at every history length, meets both.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from .background import StreamRecord, read_streams
from .points import PointStats, cell, point_stats
from .points import to_json as point_json
from .records import RequestRecord, read_records, stored_files
from .report import INTERVAL, markdown, ratio_interval

TTFT_TARGET = 0.7  # local TTFT p50 / D->P TTFT p50, at most
TPOT_TARGET = 0.10  # the background streams' TPOT p90 rise, at most
SERVED_SHARE = 0.5  # of a leg's follow-up turns that must have taken its path for the point to count
SHORT_SUFFIX = 1024  # the issue's first target is for suffixes of at most this many tokens


@dataclass(frozen=True)
class Targets:
    ttft_ratio: float = TTFT_TARGET
    tpot_rise: float = TPOT_TARGET


ISSUE_TARGETS = Targets()  # issue 33's


def rise_interval(dp: Sequence[float], local: Sequence[float]) -> tuple[float, float]:
    """A bootstrap interval for p90(local) / p90(dp) - 1 (`report.ratio_interval`).

    A p90 of a few dozen per-turn values moves a lot between runs (on the H200, +13% between
    two legs whose turns all took the same path), so the point estimate alone cannot say
    whether a rise is within 10%."""
    low, high = ratio_interval(local, dp, 90)
    return low - 1, high - 1


@dataclass(frozen=True)
class Comparison:
    """One point: the same sizes through prefill (D->P) and prefilled on decode (local)."""

    prefix: int
    suffix: int
    dp: PointStats
    local: PointStats

    @property
    def ratio(self) -> float:
        """local TTFT p50 over D->P's."""
        return self.local.ttft_p50 / self.dp.ttft_p50 if self.dp.ttft_p50 > 0 else float("nan")

    @cached_property
    def tpot_rise_interval(self) -> tuple[float, float]:
        """The rise's bootstrap interval (see rise_interval); NaNs: not measured."""
        return rise_interval(self.dp.tpots, self.local.tpots)

    @property
    def tpot_rise(self) -> float:
        """How much the streams' TPOT p90 grew with local turns (0.1: 10%); NaN: not measured."""
        if not self.dp.tpot_p90 > 0 or self.local.tpot_p90 != self.local.tpot_p90:
            return float("nan")
        return self.local.tpot_p90 / self.dp.tpot_p90 - 1

    def failures(self, targets: Targets) -> list[str]:
        """Why this point does not support going local; empty: it does."""
        out = []
        if self.local.share("local") < SERVED_SHARE:
            out.append(f"served locally in {self.local.outcomes.get('local', 0)} of {self.local.n} turns")
        if self.dp.share("hit") < SERVED_SHARE:
            out.append(f"D->P read decode's KV in {self.dp.outcomes.get('hit', 0)} of {self.dp.n} turns")
        if not self.ratio <= targets.ttft_ratio:
            out.append(f"local/D->P {cell(self.ratio, '{:.2f}')} > {targets.ttft_ratio:.2f}")
        if self.tpot_rise > targets.tpot_rise:
            out.append(f"TPOT p90 +{self.tpot_rise * 100:.0f}% > {targets.tpot_rise * 100:.0f}%")
        return out


def compare(points: Sequence[PointStats], dp_leg: str = "dp", local_leg: str = "local") -> list[Comparison]:
    """The points both legs ran, by history length then suffix."""
    by_key = {(p.leg, p.prefix_tokens, p.suffix_tokens): p for p in points}
    out = []
    for (leg, prefix, suffix), dp in sorted(by_key.items(), key=lambda kv: (kv[0][1], kv[0][2] or 0)):
        local = by_key.get((local_leg, prefix, suffix))
        if leg == dp_leg and suffix is not None and local is not None:
            out.append(Comparison(prefix, suffix, dp, local))
    return out


@dataclass(frozen=True)
class Choice:
    """The default threshold and the sentences that say why."""

    threshold: int  # 0: decode-local off
    tpot_measured: bool
    why: list[str]


def _passing_up_to(comparisons: Sequence[Comparison], targets: Targets) -> tuple[int, Comparison | None]:
    """The largest suffix up to which every point passes, and the first point that fails."""
    best = 0
    for suffix in sorted({c.suffix for c in comparisons}):
        failing = [c for c in comparisons if c.suffix == suffix and c.failures(targets)]
        if failing:
            return best, failing[0]
        best = suffix
    return best, None


def choose_threshold(comparisons: Sequence[Comparison], targets: Targets = ISSUE_TARGETS) -> Choice:
    """The largest suffix up to which every point at every history length meets both targets."""
    if not comparisons:
        return Choice(0, False, ["No point ran in both legs: no decode-local threshold can be chosen."])
    tpot_measured = all(c.tpot_rise == c.tpot_rise for c in comparisons)
    histories = sorted({c.prefix for c in comparisons})
    threshold, stop = _passing_up_to(comparisons, targets)
    rule = f"local TTFT p50 at most {targets.ttft_ratio:.2f}x D->P's"
    if tpot_measured:
        rule += f" and the background streams' TPOT p90 up by at most {targets.tpot_rise * 100:.0f}%"
    at = ", ".join(map(str, histories))
    if threshold:
        why = [
            f"Default threshold: `router.decodeLocalMaxTokens: {threshold}`, the largest suffix up to which every "
            f"measured point at every history length ({at} tokens) has {rule}."
        ]
    else:
        why = [f"Default: decode-local off (`router.decodeLocalMaxTokens: 0`): no suffix meets {rule} at every "
               f"history length ({at} tokens)."]  # fmt: skip
    if stop is not None:
        failed = "; ".join(stop.failures(targets))
        where = f"{stop.suffix} tokens of suffix on {stop.prefix} tokens of history: {failed}"
        why.append(f"It stops below {where}." if threshold else f"The shortest fails, {where}.")
    short = [c for c in comparisons if c.suffix <= SHORT_SUFFIX]
    if short:
        met = sum(1 for c in short if c.ratio <= targets.ttft_ratio)
        why.append(
            f"Suffixes of at most {SHORT_SUFFIX} tokens: local TTFT p50 at most {targets.ttft_ratio:.2f}x D->P's at "
            f"{met} of {len(short)} points."
        )
    if tpot_measured:
        spans = [c for c in comparisons if c.tpot_rise_interval[0] <= targets.tpot_rise <= c.tpot_rise_interval[1]]
        why.append(
            f"At {len(spans)} of {len(comparisons)} points the TPOT rise's {INTERVAL:.0%} interval holds "
            f"{targets.tpot_rise * 100:.0f}%: there this run cannot tell the rise from the target."
        )
    for prefix in histories:
        own, _ = _passing_up_to([c for c in comparisons if c.prefix == prefix], targets)
        why.append(f"At {prefix} tokens of history alone: up to {own or 'none'}.")
    if not tpot_measured:
        why.append("TPOT was not measured at every point (no background streams): the choice rests on TTFT alone.")
    return Choice(threshold, tpot_measured, why)


HEADERS = (
    "suffix tokens", "new tok", "D->P TTFT p50/p90", "local TTFT p50/p90", "local/D->P", "local turns",
    "TPOT p90 D->P", "TPOT p90 local", "rise 90% interval", "ITL p99 D->P / local", "verdict",
)  # fmt: skip


def _pair(a: float, b: float) -> str:
    return f"{cell(a)} / {cell(b)}"


def _interval(bounds: tuple[float, float]) -> str:
    lo, hi = bounds
    return "-" if lo != lo else f"{lo * 100:+.0f}% .. {hi * 100:+.0f}%"


def table(comparisons: Sequence[Comparison], targets: Targets) -> str:
    rows = []
    for c in comparisons:
        rise = "" if c.tpot_rise != c.tpot_rise else f" ({c.tpot_rise * 100:+.0f}%)"
        failures = c.failures(targets)
        rows.append(
            (
                str(c.suffix),
                cell(c.dp.new_tokens),
                _pair(c.dp.ttft_p50, c.dp.ttft_p90),
                _pair(c.local.ttft_p50, c.local.ttft_p90),
                cell(c.ratio, "{:.2f}x"),
                f"{c.local.outcomes.get('local', 0)}/{c.local.n}",
                cell(c.dp.tpot_p90, "{:.2f}"),
                cell(c.local.tpot_p90, "{:.2f}") + rise,
                _interval(c.tpot_rise_interval),
                f"{cell(c.dp.itl_p99, '{:.1f}')} / {cell(c.local.itl_p99, '{:.1f}')}",
                "; ".join(failures) or "meets both",
            )
        )
    return markdown(HEADERS, rows)


NOTE = (
    "Follow-up turns (turn >= 2), ms. D->P: `router.decodeLocalMaxTokens: 0`, every turn through prefill, which "
    "reads the history back from decode. local: the same sizes (other texts) prefilled on the decode that holds "
    "the conversation. new tok: median prompt tokens beyond what decode held, from the D->P leg's hits (prompt - "
    "reused): what the router weighs against the threshold. local turns: follow-up turns answered with "
    "`X-PDX-Reuse: local`. TPOT p90: the background streams' mean time per token during each follow-up turn, "
    "p90 over stream requests and turns; in brackets its rise over D->P; beside it the rise's 90% bootstrap "
    "interval. ITL p99: the streams' longest "
    "inter-token gaps during those turns, the stall one prefill in decode's batch causes."
)


def markdown_report(
    comparisons: Sequence[Comparison],
    choice: Choice,
    targets: Targets,
    context: dict[str, str] | None = None,
) -> str:
    lines = ["# decode-local against D->P: TTFT of short follow-up turns and the streams' TPOT", ""]
    lines += [f"- **{k}**: {v}" for k, v in (context or {}).items()]
    lines += ["", "## The default threshold", "", *choice.why, ""]
    for prefix in sorted({c.prefix for c in comparisons}):
        rows = [c for c in comparisons if c.prefix == prefix]
        lines += [f"## {prefix} tokens of history", "", table(rows, targets), ""]
    lines += [NOTE, ""]
    return "\n".join(lines)


def read_run(run: Path) -> tuple[list[RequestRecord], list[StreamRecord]]:
    records = [r for path in stored_files(run, "records") for r in read_records(path)]
    streams = [s for path in stored_files(run, "background") for s in read_streams(path)]
    return records, streams


def write_report(
    run: Path,
    dp_leg: str = "dp",
    local_leg: str = "local",
    targets: Targets = ISSUE_TARGETS,
) -> tuple[Choice, dict[str, Path]]:
    """decode-local.md and decode-local.json beside a run's records."""
    records, streams = read_run(run)
    points = [p for p in point_stats(records, streams) if p.leg in (dp_leg, local_leg)]
    comparisons = compare(points, dp_leg, local_leg)
    choice = choose_threshold(comparisons, targets)
    context = _context(run)
    context["legs"] = f"D->P: {dp_leg}, local: {local_leg} (records-{dp_leg}.json, records-{local_leg}.json)"
    md = run / "decode-local.md"
    md.write_text(markdown_report(comparisons, choice, targets, context))
    data: dict[str, Any] = {
        "threshold": choice.threshold,
        "tpot_measured": choice.tpot_measured,
        "why": choice.why,
        "targets": {"ttft_ratio": targets.ttft_ratio, "tpot_rise": targets.tpot_rise},
        "points": [
            {
                "prefix_tokens": c.prefix,
                "suffix_tokens": c.suffix,
                "ratio": _num(c.ratio),
                "tpot_rise": _num(c.tpot_rise),
                "tpot_rise_interval": [_num(v) for v in c.tpot_rise_interval],
                "failures": c.failures(targets),
                "dp": point_json(c.dp),
                "local": point_json(c.local),
            }
            for c in comparisons
        ],
    }
    js = run / "decode-local.json"
    js.write_text(json.dumps(data, indent=2) + "\n")
    return choice, {"report": md, "json": js}


def _num(v: float) -> float | None:
    return None if v != v else v


def _context(run: Path) -> dict[str, str]:
    """The run's own context lines (target, workload, background, wall time), when it wrote a summary."""
    try:
        context = json.loads((run / "summary.json").read_text()).get("context", {})
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in context.items() if "peak RSS" not in str(k)}
