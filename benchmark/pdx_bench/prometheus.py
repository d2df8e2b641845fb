"""pdx bench --prometheus URL: the report's reuse, TTFT and NIXL figures again, from Prometheus.

The same series the dashboard and the alerts read (pdx.monitoring), over each leg's wall-clock
window. They come from the fleet's own counters, so they include what the benchmark did not
send, and a leg's edges blur by one scrape interval.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping

from pdx.monitoring import INSTANCE_LABEL
from pdx.monitoring.alerts import REUSE


def _sum(metric: str, sel: str, w: str, by: str = "") -> str:
    group = f" by ({by})" if by else ""
    return f"sum{group} (increase({metric}{{{sel}}}[{w}]))"


def figures(window_s: float, instance: str | None = None) -> dict[str, str]:
    """PromQL per figure over the `window_s` seconds before the evaluation time."""
    w = f"{max(1, math.ceil(window_s))}s"
    sel = f'{INSTANCE_LABEL}="{instance}"' if instance else ""
    extra = f"{sel}, " if sel else ""
    hits = _sum(REUSE, f'{extra}outcome="hit"', w)
    with_entry = _sum(REUSE, f'{extra}outcome!="miss"', w)

    def ttft(q: float) -> str:
        return f"histogram_quantile({q}, {_sum('pdx_router_ttft_seconds_bucket', sel, w, 'le')}) * 1000"

    return {
        "hit rate": f"{hits} / {with_entry}",
        "reused tokens per hit": f"{_sum('pdx_router_reused_tokens_total', sel, w)} / {hits}",
        "router TTFT p50 (ms)": ttft(0.5),
        "router TTFT p95 (ms)": ttft(0.95),
        "NIXL transfers": _sum("vllm:nixl_xfer_time_seconds_count", sel, w),
        "NIXL MiB": f"{_sum('vllm:nixl_bytes_transferred_sum', sel, w)} / 1048576",
    }


def query(url: str, expr: str, at: float, timeout: float = 10.0) -> float | None:
    """One instant query's single value; None when there is no series or it is not a number."""
    params = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query?{params}", timeout=timeout) as resp:
        doc = json.loads(resp.read())
    result = doc["data"]["result"]
    if not result:
        return None
    value = float(result[0]["value"][1])
    return None if math.isnan(value) or math.isinf(value) else value


def read(url: str, start: float, end: float, instance: str | None = None) -> dict[str, float | None]:
    return {name: query(url, expr, end) for name, expr in figures(end - start, instance).items()}


def context(url: str, windows: Mapping[str, tuple[float, float]], instance: str | None = None) -> dict[str, str]:
    """Report context lines, one per leg: `Prometheus, leg on: hit rate 0.75, ...`."""
    out: dict[str, str] = {}
    for leg, (start, end) in windows.items():
        try:
            values = read(url, start, end, instance)
        except (OSError, urllib.error.URLError, KeyError, ValueError) as err:
            out[f"Prometheus, leg {leg}"] = f"not read from {url}: {err}"
            continue
        shown = ", ".join(f"{k} {'no data' if v is None else f'{v:.3g}'}" for k, v in values.items())
        out[f"Prometheus, leg {leg}"] = shown
    return out


def windows(starts: Mapping[str, float], end: float) -> dict[str, tuple[float, float]]:
    """Each leg from its start to the next leg's start (the last one to `end`)."""
    ordered = sorted(starts.items(), key=lambda kv: kv[1])
    ends = [t for _, t in ordered[1:]] + [end]
    return {leg: (start, stop) for (leg, start), stop in zip(ordered, ends, strict=True)}
