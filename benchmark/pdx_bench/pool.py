"""`pdx bench pool`: repeated runs of one command, their turns pooled per point and leg.

One run's leg has a dozen follow-ups a point, so its p99 is its slowest turn, and on a shared
machine two identical OFF legs of one run differed 1.9x (docs/results/cpu-2026-12-06g-overcommit).
A tail target is judged on many runs together: each point's turns of every run, per leg, with a
bootstrap interval for each leg's percentiles over the base leg's. Legs that repeat another under
a name of their own (`on-b`, run interleaved to spread the machine's drift) fold into it (`same`).

A point is (prompt tokens, suffix, live conversations) as the runs recorded it; follow-up turns
(turn >= 2) by default, first turns with `first`. Each run adds its records-<leg>.json, and its
summary.json's points, where present, add decode's figures of the point (waits on held KV,
releases) and its overcommit factor. Pure but for reading files.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .records import RequestRecord, leg_of, read_records, stored_files
from .report import REUSED, cell, markdown, percentile, ratio_interval

QUANTILES = (50, 90, 99)


@dataclass(frozen=True, order=True)
class Point:
    prefix: int
    suffix: str  # the suffix tokens or mix's name, "-" when not swept
    live: int  # 0: not swept

    def label(self) -> str:
        parts = [f"{self.prefix}"]
        if self.suffix != "-":
            parts.append(f"+{self.suffix}")
        if self.live:
            parts.append(f"x{self.live} live")
        return " ".join(parts)


@dataclass
class Run:
    """One run's turns and decode's figures, by point and leg (legs already folded)."""

    name: str
    ttfts: dict[tuple[Point, str], list[float]] = field(default_factory=dict)
    outcomes: dict[tuple[Point, str], Counter[str]] = field(default_factory=dict)
    figures: dict[tuple[Point, str], dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Pooled:
    point: Point
    leg: str
    runs: int
    ttfts: tuple[float, ...]
    outcomes: dict[str, int]
    waited: int | None  # summed over the runs that reported it; None: none did
    releases: int | None
    overcommit: float | None  # the runs' mean

    def q(self, quantile: float) -> float:
        return percentile(self.ttfts, quantile)

    @property
    def reused(self) -> int:
        return sum(self.outcomes.get(o, 0) for o in REUSED)


def point_of(r: RequestRecord) -> Point:
    suffix = r.suffix_mix or (str(r.suffix_tokens) if r.suffix_tokens is not None else "-")
    return Point(r.prefix_tokens, suffix, r.live_conversations or 0)


def _point_of_summary(p: Mapping[str, Any]) -> Point:
    suffix = p.get("suffix_mix") or (str(p["suffix_tokens"]) if p.get("suffix_tokens") is not None else "-")
    return Point(int(p.get("prefix_tokens") or 0), str(suffix), int(p.get("live") or 0))


def fold(leg: str, same: Mapping[str, str]) -> str:
    return same.get(leg, leg)


def read_run(path: Path, same: Mapping[str, str], first: bool = False) -> Run:
    """A run's --out: every records-<leg>.json, and summary.json's points when it has them."""
    files = stored_files(path, "records")
    if not files:
        raise ValueError(f"{path}: no records-<leg>.json (a `pdx bench` --out is asked for)")
    run = Run(path.name)
    for f in files:
        for r in read_records(f):
            if r.http_status != 200 or (r.turn == 1) != first:
                continue
            key = (point_of(r), fold(r.leg or leg_of(f), same))
            run.ttfts.setdefault(key, []).append(r.ttft_ms)
            run.outcomes.setdefault(key, Counter())[r.reuse or "none"] += 1
    summary = path / "summary.json"
    if summary.is_file() and not first:
        for p in json.loads(summary.read_text()).get("points") or []:
            key = (_point_of_summary(p), fold(str(p.get("leg", "")), same))
            if key not in run.ttfts:
                continue
            mine = run.figures.setdefault(key, {})
            for name in ("waited_on_held", "releases"):
                if p.get(name) is not None:
                    mine[name] = mine.get(name, 0) + int(p[name])
            if p.get("overcommit") is not None:
                mine.setdefault("overcommit", []).append(float(p["overcommit"]))
    return run


def pool(runs: Sequence[Run]) -> list[Pooled]:
    """Every (point, leg) any run has, its turns and counts summed over the runs."""
    keys = sorted({k for run in runs for k in run.ttfts})
    out = []
    for key in keys:
        having = [run for run in runs if key in run.ttfts]
        outcomes: Counter[str] = Counter()
        for run in having:
            outcomes.update(run.outcomes.get(key, Counter()))
        figs = [run.figures[key] for run in having if key in run.figures]
        over = [v for f in figs for v in f.get("overcommit", [])]
        out.append(
            Pooled(
                point=key[0],
                leg=key[1],
                runs=len(having),
                ttfts=tuple(t for run in having for t in run.ttfts[key]),
                outcomes=dict(sorted(outcomes.items())),
                waited=_sum(figs, "waited_on_held"),
                releases=_sum(figs, "releases"),
                overcommit=statistics.fmean(over) if over else None,
            )
        )
    return out


def _sum(figs: Sequence[Mapping[str, Any]], name: str) -> int | None:
    values = [int(f[name]) for f in figs if name in f]
    return sum(values) if values else None


def against(row: Pooled, base: Pooled | None, quantile: float) -> tuple[float, float, float] | None:
    """(ratio, low, high): row's percentile over base's, with its 90% bootstrap interval."""
    if base is None or row is base or not row.ttfts or not base.ttfts:
        return None
    low, high = ratio_interval(row.ttfts, base.ttfts, q=quantile)
    return row.q(quantile) / base.q(quantile), low, high


def _ratio_cell(r: tuple[float, float, float] | None) -> str:
    return "-" if r is None else f"{r[0]:.2f} ({r[1]:.2f}-{r[2]:.2f})"


HEADERS = (
    "point", "overcommit", "leg", "runs", "n", "p50", "p90", "p99", "p50/base (90%)", "p99/base (90%)",
    "reused", "outcomes", "waited", "released",
)  # fmt: skip


def rows(pooled: Sequence[Pooled], base: str) -> list[tuple[str, ...]]:
    by_key = {(p.point, p.leg): p for p in pooled}
    out = []
    for p in pooled:
        b = by_key.get((p.point, base))
        out.append(
            (
                p.point.label(),
                cell(p.overcommit, "{:.1f}x"),
                p.leg,
                str(p.runs),
                str(len(p.ttfts)),
                *(cell(p.q(q)) for q in QUANTILES),
                _ratio_cell(against(p, b, 50)),
                _ratio_cell(against(p, b, 99)),
                f"{p.reused}/{len(p.ttfts)} ({100 * p.reused / len(p.ttfts):.0f}%)" if p.ttfts else "-",
                ", ".join(f"{k} {v}" for k, v in p.outcomes.items()),
                cell(p.waited),
                cell(p.releases),
            )
        )
    return out


def markdown_table(pooled: Sequence[Pooled], base: str) -> str:
    return markdown(HEADERS, rows(pooled, base))


def to_json(pooled: Sequence[Pooled], base: str) -> list[dict[str, Any]]:
    by_key = {(p.point, p.leg): p for p in pooled}
    out = []
    for p in pooled:
        b = by_key.get((p.point, base))
        doc: dict[str, Any] = {
            "prefix_tokens": p.point.prefix,
            "suffix": p.point.suffix,
            "live": p.point.live,
            "leg": p.leg,
            "runs": p.runs,
            "n": len(p.ttfts),
            "overcommit": p.overcommit,
            "outcomes": p.outcomes,
            "reused": p.reused,
            "waited_on_held": p.waited,
            "releases": p.releases,
        }
        for q in QUANTILES:
            doc[f"ttft_p{q}"] = p.q(q)
            r = against(p, b, q)
            doc[f"ttft_p{q}_over_base"] = None if r is None else {"ratio": r[0], "low": r[1], "high": r[2]}
        out.append(doc)
    return out


def parse_same(pairs: Sequence[str]) -> dict[str, str]:
    """`LEG=AS` pairs; raises ValueError naming the bad one."""
    out = {}
    for pair in pairs:
        leg, sep, as_ = pair.partition("=")
        if not sep or not leg.strip() or not as_.strip():
            raise ValueError(f"--same {pair!r}: expected LEG=AS, e.g. --same on-b=on")
        out[leg.strip()] = as_.strip()
    return out
