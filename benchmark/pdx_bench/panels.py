"""The dashboard's panels for each leg of a run, from Prometheus range queries: what a person
watching the Grafana dashboard (pdx.monitoring.dashboard) would have seen, OFF beside ON."""

from __future__ import annotations

import json
import math
import re
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from pdx.monitoring import dashboard

Series = tuple[dict[str, str], list[tuple[float, float]]]
STYLE = {"off": "--", "on": "-"}


def range_query(url: str, expr: str, start: float, end: float, step: float) -> list[Series]:
    params = urllib.parse.urlencode(
        {"query": dashboard.expand(expr), "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    )
    with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query_range?{params}", timeout=30) as resp:
        doc = json.loads(resp.read())
    out: list[Series] = []
    for item in doc["data"]["result"]:
        points = [(float(t), float(v)) for t, v in item["values"] if not math.isnan(float(v))]
        out.append((item["metric"], points))
    return out


def legend(template: str, labels: Mapping[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)


def draw(url: str, windows: Mapping[str, tuple[float, float]], out: Path, step: float = 2.0) -> dict[str, int]:
    """One subplot per panel, each leg's series over the seconds since the leg started (OFF
    dashed, ON solid). Returns the number of series each panel had, over all legs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = dashboard.PANELS
    cols = 3
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.6 * rows), squeeze=False)
    counts: dict[str, int] = {}
    for ax, panel in zip(axes.flat, panels, strict=False):
        n = 0
        for leg, (start, end) in windows.items():
            for q in panel.queries:
                for labels, points in range_query(url, q.expr, start, end, step):
                    if not points:
                        continue
                    n += 1
                    xs = [t - start for t, _ in points]
                    ax.plot(xs, [v for _, v in points], STYLE.get(leg, ":"), label=f"{leg}: {legend(q.legend, labels)}")
        counts[panel.title] = n
        ax.set_title(panel.title + ("" if n else " (no data)"), fontsize=10)
        ax.set_xlabel("s since the leg started", fontsize=8)
        ax.tick_params(labelsize=7)
        if n:
            ax.legend(fontsize=6, loc="best")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle("pdx dashboard panels per leg (Prometheus range queries): off dashed, on solid")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return counts


__all__ = ["draw", "legend", "range_query"]
