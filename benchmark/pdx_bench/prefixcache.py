"""`pdx bench report-prefix-cache`: "why not just prefix caching?", from runs of the live sweep.

Each run (`pdx bench --live ... --leg ...`, one topology) holds the legs:

- `plain` (OFF): prefill's prefix cache off, bidirectional off (the seed's OFF);
- `cache` (OFF+cache): prefill's prefix cache on and router affinity (a conversation goes back
  to the prefill that served it), bidirectional off: a platform's default without pdx;
- `bidir` (ON): bidirectional, prefill's prefix cache off (the seed's ON);
- `bidir-cache` (ON+cache): bidirectional with prefill's prefix cache on and affinity: vLLM
  takes what prefill's own cache holds first and reads only the rest from decode.

(`off` and `on` name the legs that flip only the switch, so these legs have names of their own.)

The report reads each run's `summary.json` (its points: follow-up turns' TTFT, router outcomes,
where prefill's tokens came from; the topology; prefill's KV capacity) and puts the runs side by
side: TTFT p50 and p90 against live conversations, one line per leg and topology, the hit mix,
what ON adds on top of `cache` at each point, where the curves cross, and which prefill prefix
cache setting the numbers support under ON. Pure but for reading and writing files.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .report import cell, markdown

OFF, CACHE, ON, ON_CACHE = "plain", "cache", "bidir", "bidir-cache"
LEGS = (OFF, CACHE, ON, ON_CACHE)
LEG_TEXT = {
    OFF: "OFF: prefill cache off",
    CACHE: "OFF+cache: prefill cache + affinity",
    ON: "ON: bidirectional, prefill cache off",
    ON_CACHE: "ON+cache: bidirectional, prefill cache + affinity",
}
COLORS = {OFF: "tab:red", CACHE: "tab:orange", ON: "tab:blue", ON_CACHE: "tab:green"}
# ON wins a point when its TTFT p50 is at most this share of OFF+cache's (5% is within this
# machine's run-to-run noise at a handful of turns a point).
WIN = 0.95


@dataclass(frozen=True)
class LegPoint:
    """One leg's follow-up turns at one number of live conversations."""

    leg: str
    live: int
    n: int
    ttft_p50: float
    ttft_p90: float
    outcomes: dict[str, int]
    sources: dict[str, float] | None  # local, remote, computed tokens on prefill (follow-ups)

    def share(self, part: str) -> float | None:
        if self.sources is None:
            return None
        total = sum(self.sources.values())
        return self.sources[part] / total if total > 0 else None


@dataclass(frozen=True)
class Run:
    """One run: its topology, prefill's KV capacity and its points."""

    name: str  # the run's directory
    topology: str
    capacity: dict[str, list[int | None]]  # per leg: prefill engines' KV tokens
    points: list[LegPoint] = field(default_factory=list)

    def point(self, leg: str, live: int) -> LegPoint | None:
        return next((p for p in self.points if p.leg == leg and p.live == live), None)

    @property
    def lives(self) -> list[int]:
        return sorted({p.live for p in self.points})

    @property
    def legs(self) -> list[str]:
        return [leg for leg in LEGS if any(p.leg == leg for p in self.points)] + sorted(
            {p.leg for p in self.points} - set(LEGS)
        )

    def prefill_capacity(self) -> int | None:
        """Prefill's KV tokens, all its engines together (the same in every leg, or None)."""
        totals = {sum(n for n in per if n) for per in self.capacity.values() if per and all(per)}
        return totals.pop() if len(totals) == 1 else None


def run_from_summary(name: str, summary: dict[str, Any]) -> Run:
    """A run from its summary.json; only points of the live sweep count."""
    context = summary.get("context", {})
    capacity = {leg: per.get("prefill", []) for leg, per in (summary.get("capacity") or {}).items()}
    points = [
        LegPoint(
            leg=str(p["leg"]),
            live=int(p["live"]),
            n=int(p["n"]),
            ttft_p50=float(p["ttft_p50"]) if p["ttft_p50"] is not None else float("nan"),
            ttft_p90=float(p["ttft_p90"]) if p["ttft_p90"] is not None else float("nan"),
            outcomes=dict(p.get("outcomes") or {}),
            sources=p.get("sources"),
        )
        for p in summary.get("points", [])
        if p.get("live") is not None
    ]
    return Run(name, str(context.get("topology", name)), capacity, points)


def read_run(path: Path) -> Run:
    return run_from_summary(path.name, json.loads((path / "summary.json").read_text()))


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def ttft_rows(run: Run) -> list[tuple[str, ...]]:
    """Per live count: each leg's p50/p90, and OFF+cache over ON+cache (what ON adds)."""
    out = []
    for live in run.lives:
        row = [str(live)]
        for leg in run.legs:
            p = run.point(leg, live)
            row.append("-" if p is None else f"{cell(p.ttft_p50)} / {cell(p.ttft_p90)}")
        row.append(cell(gain(run, live), "{:.2f}x"))
        out.append(tuple(row))
    return out


def gain(run: Run, live: int) -> float | None:
    """OFF+cache's TTFT p50 over the better ON leg's: what bidirectional adds on top of the
    default (above 1: ON is faster)."""
    cache = run.point(CACHE, live)
    ons = [p for leg in (ON, ON_CACHE) if (p := run.point(leg, live)) is not None and p.ttft_p50 > 0]
    if cache is None or not ons:
        return None
    return cache.ttft_p50 / min(p.ttft_p50 for p in ons)


def mix_rows(run: Run) -> list[tuple[str, ...]]:
    """Per leg and live count: the router's outcomes and prefill's token sources."""
    out: list[tuple[str, ...]] = []
    for leg in run.legs:
        for live in run.lives:
            p = run.point(leg, live)
            if p is None:
                continue
            outcomes = ", ".join(f"{k} {v}" for k, v in sorted(p.outcomes.items())) or "-"
            out.append(
                (
                    leg,
                    str(live),
                    str(p.n),
                    outcomes,
                    _pct(p.share("local")),
                    _pct(p.share("remote")),
                    _pct(p.share("computed")),
                )
            )
    return out


MIX_HEADERS = ("leg", "live", "n", "router outcomes", "P cache", "D->P read", "computed")


def crossing(run: Run) -> int | None:
    """The fewest live conversations from which on ON beats OFF+cache at every larger count too."""
    lives = [live for live in run.lives if gain(run, live) is not None]
    winning = [live for live in lives if (g := gain(run, live)) is not None and g >= 1 / WIN]
    for live in winning:
        if all((g := gain(run, later)) is not None and g >= 1 / WIN for later in lives if later >= live):
            return live
    return None


def prefill_cache_under_on(runs: Sequence[Run]) -> tuple[int, int, int]:
    """Points where ON+cache's p50 was lower than ON's by more than the noise, higher by more, or
    neither."""
    better = worse = even = 0
    for run in runs:
        for live in run.lives:
            a, b = run.point(ON_CACHE, live), run.point(ON, live)
            if a is None or b is None or b.ttft_p50 <= 0:
                continue
            ratio = a.ttft_p50 / b.ttft_p50
            if ratio <= WIN:
                better += 1
            elif ratio >= 1 / WIN:
                worse += 1
            else:
                even += 1
    return better, worse, even


def findings(runs: Sequence[Run]) -> list[str]:
    """The verdict in numbers, one sentence per fact."""
    lines: list[str] = []
    for run in runs:
        cap = run.prefill_capacity()
        where = f"{run.topology} (prefill KV {cap:,} tokens)" if cap else run.topology
        gains = [(live, g) for live in run.lives if (g := gain(run, live)) is not None]
        if not gains:
            lines.append(f"{where}: no point has both OFF+cache and an ON leg.")
            continue
        text = ", ".join(f"{g:.2f}x at {live}" for live, g in gains)
        cross = crossing(run)
        lines.append(f"{where}: OFF+cache's TTFT p50 over ON's (the better of ON and ON+cache): {text}.")
        if cross is None:
            lines.append(f"{where}: ON does not beat OFF+cache by 5% from any live count on.")
        else:
            lines.append(f"{where}: ON beats OFF+cache by at least 5% from {cross} live conversations on.")
        for live in (run.lives[0], run.lives[-1]):
            c = run.point(CACHE, live)
            if c is not None and c.share("local") is not None:
                lines.append(
                    f"{where}, {live} live: OFF+cache found {_pct(c.share('local'))} of the follow-ups' "
                    f"prompt tokens in prefill's cache and computed {_pct(c.share('computed'))}."
                )
            o = run.point(ON_CACHE, live)
            if o is not None and o.share("local") is not None:
                lines.append(
                    f"{where}, {live} live: ON+cache took {_pct(o.share('local'))} from prefill's cache, "
                    f"{_pct(o.share('remote'))} by the D->P read, computed {_pct(o.share('computed'))}."
                )
    better, worse, even = prefill_cache_under_on(runs)
    if better + worse + even:
        lines.append(
            f"Under ON, prefill's prefix cache on (ON+cache) against off (ON): lower TTFT p50 at {better} points, "
            f"higher at {worse}, within 5% at {even}."
        )
    return lines


def plot(runs: Sequence[Run], path: Path) -> Path:
    """TTFT p50 and p90 against live conversations (log scale): one line per leg and topology."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=False)
    styles = ["-", "--", ":", "-."]
    for ax, (attr, title) in zip(axes, (("ttft_p50", "TTFT p50"), ("ttft_p90", "TTFT p90")), strict=True):
        for i, run in enumerate(runs):
            for leg in run.legs:
                pts = sorted((p for p in run.points if p.leg == leg), key=lambda p: p.live)
                ax.plot(
                    [p.live for p in pts],
                    [getattr(p, attr) for p in pts],
                    marker="o",
                    linestyle=styles[i % len(styles)],
                    color=COLORS.get(leg),
                    label=f"{run.topology} {LEG_TEXT.get(leg, leg)}",
                )
            cap = run.prefill_capacity()
            if cap:
                where = (0.02, 0.96 - 0.05 * i)
                ax.annotate(f"{run.topology}: prefill KV {cap} tokens", where, xycoords="axes fraction", fontsize=8)
        ax.set_xlabel("live conversations")
        ax.set_ylabel(f"{title} of follow-up turns (ms, log scale)")
        ax.set_title(f"{title} vs live conversations")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_yscale("log")  # an overloaded point is 10-100x the others'; the rest must stay readable
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


NOTE = (
    "TTFT: follow-up turns (turn >= 2) through the router, ms, p50 / p90. ON gain: OFF+cache's p50 over the "
    "better ON leg's. P cache / D->P read / computed: the follow-ups' prompt tokens on prefill by where their "
    "KV came from (vLLM's vllm:prompt_tokens_by_source over the point, the first turns' prompts taken off "
    "computed). Router outcomes: X-PDX-Reuse per follow-up turn (`hit`: a D->P read was planned; with "
    "bidirectional off every turn is a `miss`)."
)


def markdown_report(runs: Sequence[Run], png: Path | None) -> str:
    lines = ["# Prefix caching, cache pressure and bidirectional KV transfer", ""]
    for run in runs:
        cap = run.prefill_capacity()
        lines.append(
            f"- **{run.topology}** (`{run.name}`): legs {', '.join(run.legs)}; live conversations "
            f"{', '.join(map(str, run.lives))}; prefill KV capacity "
            + (f"{cap:,} tokens over its engines" if cap else "not read")
        )
    lines.append("")
    if png is not None:
        lines += [f"![TTFT vs live conversations]({png.name})", ""]
    lines += ["## Findings", ""] + [f"- {line}" for line in findings(runs)] + [""]
    for run in runs:
        headers = ("live", *(f"{leg} p50 / p90" for leg in run.legs), "ON gain")
        lines += [f"## {run.topology}: TTFT (ms)", "", markdown(headers, ttft_rows(run)), ""]
        lines += [f"## {run.topology}: where the tokens came from", "", markdown(MIX_HEADERS, mix_rows(run)), ""]
    lines += ["## Notes", "", NOTE, ""]
    return "\n".join(lines)


def to_json(runs: Sequence[Run]) -> dict[str, Any]:
    return {
        "runs": [
            {
                "name": run.name,
                "topology": run.topology,
                "prefill_capacity_tokens": run.prefill_capacity(),
                "crossing_live": crossing(run),
                "gain": {str(live): gain(run, live) for live in run.lives},
            }
            for run in runs
        ],
        "prefill_cache_under_on": dict(zip(("better", "worse", "even"), prefill_cache_under_on(runs), strict=True)),
        "findings": findings(runs),
    }


def write_report(runs: Sequence[Run], out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    png = plot(runs, out / "ttft_vs_live.png")
    md = out / "prefix-cache.md"
    md.write_text(markdown_report(runs, png))
    js = out / "prefix-cache.json"
    js.write_text(json.dumps(to_json(runs), indent=2) + "\n")
    return {"plot": png, "report": md, "json": js}
