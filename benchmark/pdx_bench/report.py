"""Summaries of a sweep: the terminal table, the seed's two plots, a Markdown report.

Only follow-up turns (turn >= 2) enter the comparison: the first turn of a conversation has
nothing to reuse in either leg, so including it would dilute the difference being measured.
Groups are keyed by the sweep's prefix length; the plots' x axis is the engine-reported
prompt length (the group's mean `input_num_tokens`), as in the seed article. The bound (the
same turns sent whole straight to the decode engine that holds the conversation) is a third
leg beside OFF and ON.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .records import RequestRecord


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100), numpy's default method."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


INTERVAL = 0.9  # the bootstrap intervals' level, as the reports print it
DRAWS = 2000


def ratio_interval(
    num: Sequence[float], den: Sequence[float], q: float = 50, level: float = INTERVAL, draws: int = DRAWS
) -> tuple[float, float]:
    """A bootstrap interval for percentile(num, q) / percentile(den, q), each side resampled with
    replacement; NaNs when a side is empty. A percentile of a few turns moves a lot between runs,
    so a ratio near its target says nothing without this. Seeded: the same values, the same interval."""
    if not num or not den:
        return float("nan"), float("nan")
    rng = random.Random(0)
    ratios = sorted(
        percentile(rng.choices(num, k=len(num)), q) / percentile(rng.choices(den, k=len(den)), q) for _ in range(draws)
    )
    tail = (1 - level) / 2
    return percentile(ratios, 100 * tail), percentile(ratios, 100 * (1 - tail))


def ratio_interval_cell(bounds: Sequence[float]) -> str:
    """A `ratio_interval` as `low-highx`; `-` where it could not be drawn (NaNs)."""
    low, high = bounds
    return "-" if low != low or high != high else f"{low:.2f}-{high:.2f}x"


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


@dataclass(frozen=True)
class LegStats:
    n: int
    prompt_tokens: float
    ttft_p50: float
    ttft_p90: float
    prefill_ms: float
    kv_transfer_ms: float
    hit_rate: float


@dataclass(frozen=True)
class Row:
    length: int
    off: LegStats | None
    on: LegStats | None
    bound: LegStats | None = None

    @property
    def ratio(self) -> float:
        """OFF median TTFT over ON median TTFT: how many times faster reuse made it."""
        if self.off is None or self.on is None or self.on.ttft_p50 <= 0:
            return float("nan")
        return self.off.ttft_p50 / self.on.ttft_p50

    @property
    def on_over_bound(self) -> float:
        """ON median TTFT over the bound's: how far ON stays from decode serving the turn alone."""
        if self.on is None or self.bound is None or self.bound.ttft_p50 <= 0:
            return float("nan")
        return self.on.ttft_p50 / self.bound.ttft_p50


# Turns that reused decode's KV: read back by prefill (`hit`) or prefilled on decode itself (`local`).
REUSED = ("hit", "local")


def leg_stats(records: Sequence[RequestRecord]) -> LegStats | None:
    if not records:
        return None
    ttft = [r.ttft_ms for r in records]
    prefill = [r.prefill_ms for r in records if r.prefill_ms is not None]
    xfer = [r.kv_transfer_ms for r in records if r.kv_transfer_ms is not None]
    hits = sum(1 for r in records if r.reuse in REUSED)
    return LegStats(
        n=len(records),
        prompt_tokens=_mean([float(r.input_num_tokens) for r in records]),
        ttft_p50=percentile(ttft, 50),
        ttft_p90=percentile(ttft, 90),
        prefill_ms=_mean(prefill),
        kv_transfer_ms=_mean(xfer) if xfer else 0.0,
        hit_rate=hits / len(records),
    )


def summarize(records: Sequence[RequestRecord], min_turn: int = 2) -> list[Row]:
    picked = [r for r in records if r.turn >= min_turn]
    lengths = sorted({r.prefix_tokens for r in picked})
    rows = []
    for length in lengths:
        group = [r for r in picked if r.prefix_tokens == length]
        rows.append(
            Row(
                length=length,
                off=leg_stats([r for r in group if r.leg == "off"]),
                on=leg_stats([r for r in group if r.leg in ("on", "run", "")]),
                bound=leg_stats([r for r in group if r.leg == "bound"]),
            )
        )
    return rows


def cell(v: float | None, fmt: str = "{:.0f}") -> str:
    """A table cell: the figure formatted, or - for None and NaN."""
    if v is None or v != v:  # None or NaN
        return "-"
    return fmt.format(v)


HEADERS = (
    "prefix", "prompt tok", "n off/on", "OFF p50", "OFF p90", "ON p50", "ON p90", "OFF/ON", "ON hit rate",
    "bound p50", "ON/bound",
)  # fmt: skip


def table_rows(rows: Sequence[Row]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for r in rows:
        prompt = r.on.prompt_tokens if r.on else (r.off.prompt_tokens if r.off else None)
        n = f"{r.off.n if r.off else 0}/{r.on.n if r.on else 0}"  # requests per leg
        out.append(
            (
                str(r.length),
                cell(prompt),
                n,
                cell(r.off.ttft_p50 if r.off else None),
                cell(r.off.ttft_p90 if r.off else None),
                cell(r.on.ttft_p50 if r.on else None),
                cell(r.on.ttft_p90 if r.on else None),
                cell(r.ratio, "{:.2f}x"),
                cell(r.on.hit_rate * 100 if r.on else None, "{:.0f}%"),
                cell(r.bound.ttft_p50 if r.bound else None),
                cell(r.on_over_bound, "{:.2f}x"),
            )
        )
    return out


def plain(headers: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A right-aligned plain-text table."""
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in body]
    return "\n".join(lines)


def markdown(headers: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---:|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def format_table(rows: Sequence[Row]) -> str:
    """Plain-text table for the terminal; TTFT in ms, turns >= 2."""
    return plain(HEADERS, table_rows(rows))


def markdown_table(rows: Sequence[Row]) -> str:
    return markdown(HEADERS, table_rows(rows))


# -------------------------------------------------------------------------------- plots


LINES = (
    ("off", "tab:red", "bidirectional OFF"),
    ("on", "tab:blue", "bidirectional ON"),
    ("bound", "tab:green", "bound: whole turn on decode (its prefix cache)"),
)


@dataclass(frozen=True)
class Series:
    label: str
    color: str
    xs: list[float]
    p50: list[float]
    p90: list[float]


def ttft_series(rows: Sequence[Row]) -> list[Series]:
    """The TTFT plot's lines: one per leg that has points (OFF, ON, the bound)."""
    out = []
    for leg, color, label in LINES:
        pts = [getattr(r, leg) for r in rows if getattr(r, leg) is not None]
        if pts:
            out.append(
                Series(
                    label, color, [p.prompt_tokens for p in pts], [p.ttft_p50 for p in pts], [p.ttft_p90 for p in pts]
                )
            )
    return out


def plot_ttft(rows: Sequence[Row], path: Path, title: str = "TTFT vs prompt length") -> Path:
    """Median TTFT (p90 as error bar) against mean prompt length, one line per leg."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for line in ttft_series(rows):
        up = [hi - mid for hi, mid in zip(line.p90, line.p50, strict=True)]
        ax.errorbar(
            line.xs, line.p50, yerr=[[0.0] * len(up), up], marker="o", color=line.color, label=line.label, capsize=3
        )
    ax.set_xlabel("prompt length (tokens, engine-reported)")
    ax.set_ylabel("TTFT (ms): median, bar to p90")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_prefill_breakdown(
    rows: Sequence[Row], path: Path, title: str = "Prefill time: compute vs KV transfer"
) -> Path:
    """Paired bars per length: OFF is all compute; ON is compute plus the D->P KV read."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.38
    xs = list(range(len(rows)))
    off_total = [r.off.prefill_ms if r.off else 0.0 for r in rows]
    on_xfer = [r.on.kv_transfer_ms if r.on else 0.0 for r in rows]
    on_compute = [max(0.0, (r.on.prefill_ms if r.on else 0.0) - x) for r, x in zip(rows, on_xfer, strict=True)]
    off_x = [x - width / 2 for x in xs]
    on_x = [x + width / 2 for x in xs]
    ax.bar(off_x, _nz(off_total), width, color="tab:red", label="OFF: prefill compute")
    ax.bar(on_x, _nz(on_compute), width, color="tab:blue", label="ON: prefill compute")
    ax.bar(on_x, _nz(on_xfer), width, bottom=_nz(on_compute), color="tab:orange", label="ON: KV transfer (D->P)")
    ax.set_xticks(xs, [str(r.length) for r in rows])
    ax.set_xlabel("prefix length (tokens)")
    ax.set_ylabel("prefill time per request (ms, mean)")
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _nz(values: Sequence[float]) -> list[float]:
    return [0.0 if v != v else v for v in values]


# ------------------------------------------------------------------------------- report


def markdown_report(
    rows: Sequence[Row],
    ttft_png: Path | None,
    prefill_png: Path | None,
    *,
    title: str = "pdx bench",
    context: dict[str, str] | None = None,
    notes: Sequence[str] = (),
    sections: Sequence[tuple[str, str]] = (),
) -> str:
    """`sections`: further (heading, Markdown) parts, after the TTFT table and its plot; no
    plots: no OFF/ON table either (a run of named legs only)."""
    lines = [f"# {title}", ""]
    if context:
        lines += [f"- **{k}**: {v}" for k, v in context.items()]
        lines.append("")
    if ttft_png is not None:
        lines += [
            "## TTFT by prefix length (ms, turns >= 2)",
            "",
            markdown_table(rows),
            "",
            f"![TTFT vs prompt length]({ttft_png.name})",
            "",
        ]
    for heading, body in sections:
        lines += [f"## {heading}", "", body, ""]
    if prefill_png is not None:
        lines += [
            "## Prefill time: compute and KV transfer",
            "",
            f"![Prefill breakdown]({prefill_png.name})",
            "",
        ]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def write_report(
    records: Sequence[RequestRecord],
    out: Path,
    *,
    title: str = "pdx bench",
    context: dict[str, str] | None = None,
    notes: Sequence[str] = (),
    sections: Sequence[tuple[str, str]] = (),
    off_on: bool = True,
) -> tuple[list[Row], dict[str, Path]]:
    """Plots and report.md into `out`; returns the table rows and the files written.

    `off_on` False (only named legs ran): neither the OFF/ON table nor its plots."""
    rows = summarize(records)
    out.mkdir(parents=True, exist_ok=True)
    md = out / "report.md"
    if not off_on:
        md.write_text(markdown_report(rows, None, None, title=title, context=context, notes=notes, sections=sections))
        return rows, {"report": md}
    ttft = plot_ttft(rows, out / "ttft_vs_prompt_length.png")
    prefill = plot_prefill_breakdown(rows, out / "prefill_breakdown.png")
    md.write_text(markdown_report(rows, ttft, prefill, title=title, context=context, notes=notes, sections=sections))
    return rows, {"ttft_plot": ttft, "prefill_plot": prefill, "report": md}
