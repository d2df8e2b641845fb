"""The wave's targets (issues 41 and 43), each judged from the parts a wave wrote.

Every closing note of a wave had restated these by hand from the parts' reports; here each is
one function of the files, so `report.md` and `report.json` say which held. A target whose part
did not run (or lacks the figure) is `None`: not judged, never passed. Pure but for reading.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from .decodelocal import TPOT_TARGET
from .report import cell, markdown, ratio_interval_cell

BOUND = 1.25  # ON (and the D->P path) over the bound, 2k-token suffixes
FIRST_TURN = 1.03  # ON's first turn over OFF's, p50
GROWTH = 1.5  # ON p50 from 8k to 24k
TPOT_RISE = TPOT_TARGET  # decode-local streams' TPOT p90, as report-decode-local judges it


@dataclass(frozen=True)
class Verdict:
    target: str
    issue: int
    figure: str
    met: bool | None  # None: not judged (the part did not run, or lacks the figure)


def _json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


K = TypeVar("K", int, tuple[int, int])  # a point's key: its prefix, or its prefix and suffix


def _prefix(point: Mapping[str, Any]) -> int:
    return int(point["prefix_tokens"])


def _prefix_and_suffix(point: Mapping[str, Any]) -> tuple[int, int]:
    return int(point["prefix_tokens"] or 0), int(point["suffix_tokens"] or 0)


def _keyed(
    summary: Mapping[str, Any] | None, leg: str, key: Callable[[Mapping[str, Any]], K]
) -> dict[K, Mapping[str, Any]]:
    if summary is None:
        return {}
    return {key(p): p for p in summary.get("points", []) if p.get("leg") == leg}


def _points(summary: Mapping[str, Any] | None, leg: str) -> dict[int, Mapping[str, Any]]:
    return _keyed(summary, leg, _prefix)


def _x(v: float | None) -> str:
    return cell(v, "{:.2f}x")


def sweep_longest_p99(sweep: Mapping[str, Any] | None) -> Verdict:
    name = "the sweep's longest point: ON p99 <= OFF p99"
    on, off = _points(sweep, "on"), _points(sweep, "off")
    both = sorted(set(on) & set(off))
    if not both or on[both[-1]].get("ttft_p99") is None or off[both[-1]].get("ttft_p99") is None:
        return Verdict(name, 41, "-", None)
    n = both[-1]
    a, b = float(on[n]["ttft_p99"]), float(off[n]["ttft_p99"])
    return Verdict(name, 41, f"{n}: ON {a:.0f} ms, OFF {b:.0f}", a <= b)


def overcommit(summary: Mapping[str, Any] | None) -> Verdict:
    name = "overcommit point: ON p99 <= OFF p99, no request waited on held KV"
    on, off = list(_points(summary, "on").values()), list(_points(summary, "off").values())
    if not on or not off or on[0].get("ttft_p99") is None or off[0].get("ttft_p99") is None:
        return Verdict(name, 41, "-", None)
    p, q = on[0], off[0]
    ratio = float(p["ttft_p99"]) / float(q["ttft_p99"])
    band = p.get("ttft_p99_over_off") or {}
    interval = f" ({band['low']:.2f}-{band['high']:.2f})" if "low" in band else ""
    waited = p.get("waited_on_held")
    figure = f"p99 {float(p['ttft_p99']):.0f} / {float(q['ttft_p99']):.0f} ms: {ratio:.2f}x{interval}"
    figure += f"; waited {cell(waited)}"
    met = (ratio <= 1.0 and waited == 0) if waited is not None else None
    return Verdict(name, 41, figure, met)


def _ratios(summary: Mapping[str, Any] | None, leg: str, base: str, figure: str) -> dict[int, float]:
    """`leg`'s `figure` over `base`'s, per prefix both measured."""
    return _keyed_ratios(summary, leg, base, figure, _prefix)


def _keyed_ratios(
    summary: Mapping[str, Any] | None, leg: str, base: str, figure: str, key: Callable[[Mapping[str, Any]], K]
) -> dict[K, float]:
    """`leg`'s `figure` over `base`'s, per point (by `key`) both measured."""
    base_points, points = _keyed(summary, base, key), _keyed(summary, leg, key)
    out: dict[K, float] = {}
    for n in sorted(set(base_points) & set(points)):
        b, a = base_points[n].get(figure), points[n].get(figure)
        if a is not None and b:
            out[n] = float(a) / float(b)
    return out


def over_bound(summary: Mapping[str, Any] | None, leg: str, name: str) -> Verdict:
    ratios = list(_ratios(summary, leg, "bound", "ttft_p50").items())
    if not ratios:
        return Verdict(name, 43, "-", None)
    figure = ", ".join(f"{_x(r)} at {n // 1000}k" for n, r in ratios)
    return Verdict(name, 43, figure, all(r <= BOUND for _, r in ratios))


def first_turns(rows: Sequence[Mapping[str, Any]]) -> Verdict:
    """A length over the target shows its 90% interval too: a p50 of a few first turns moves
    several percent between runs (h100-2026-12-07j-wave: 1.046x at 32k, 0.98-1.07x pooled)."""
    name = f"ON's first turn <= {FIRST_TURN}x OFF's (p50)"
    have = [r for r in rows if r.get("first_on_over_off") is not None]
    if not have:
        return Verdict(name, 43, "-", None)

    def shown(row: Mapping[str, Any]) -> str:
        ratio, bounds = row["first_on_over_off"], row.get("first_on_over_off_90")
        at = f"{ratio:.3f}x at {int(row['length']) // 1000}k"
        interval = ratio_interval_cell(bounds) if bounds else "-"
        return at if ratio <= FIRST_TURN or interval == "-" else f"{at} (90%: {interval})"

    figure = ", ".join(shown(r) for r in have)
    return Verdict(name, 43, figure, all(r["first_on_over_off"] <= FIRST_TURN for r in have))


def growth(value: float | None) -> Verdict:
    name = f"ON p50 growth from 8k to 24k <= {GROWTH}x"
    return Verdict(name, 43, _x(value), None if value is None else value <= GROWTH)


def tpot(decode_local: Mapping[str, Any] | None) -> Verdict:
    """The streams' TPOT p90 rise where the local leg's turns did go local."""
    name = f"decode-local: the streams' TPOT p90 up by at most {TPOT_RISE:.0%}"
    served = [
        p
        for p in (decode_local or {}).get("points", [])
        if (p.get("local") or {}).get("outcomes", {}).get("local") and p.get("tpot_rise") is not None
    ]
    if not served:
        return Verdict(name, 43, "-", None)
    figure = ", ".join(f"{p['tpot_rise']:+.0%} at {p['suffix_tokens']} new tokens" for p in served)
    return Verdict(name, 43, figure, all(p["tpot_rise"] <= TPOT_RISE for p in served))


FIRST_TOKEN_CHECK = "first_token_"  # the prefix of gpu-correct.sh's checks of its third run (FIRST_TOKEN=1)


def correct(summary: Mapping[str, Any] | None) -> Verdict:
    """gpu-correct.sh's checks of the defaults (its third run, where it ran, judged apart)."""
    name = "gpu-correct.sh with the defaults"
    if summary is None or "passed" not in summary:
        return Verdict(name, 43, "-", None)
    checks = [c for c in summary.get("checks", []) if not c["name"].startswith(FIRST_TOKEN_CHECK)]
    if not checks and not summary["passed"]:  # the run could not finish: its error says why
        return Verdict(name, 43, "FAIL: " + str(summary.get("error", "no check ran")), False)
    failed = [c["name"] for c in checks if not c.get("passed")]
    return Verdict(name, 43, "FAIL: " + ", ".join(failed) if failed else "PASS", not failed)


def correct_first(summary: Mapping[str, Any] | None) -> list[Verdict]:
    """gpu-correct.sh's third run, prefill's first token streamed: judged only where it ran."""
    checks = [c for c in (summary or {}).get("checks", []) if c["name"].startswith(FIRST_TOKEN_CHECK)]
    if not checks:
        return []
    failed = [c["name"] for c in checks if not c.get("passed")]
    detail = "; ".join(c["detail"] for c in checks)
    figure = ("FAIL: " + ", ".join(failed) + f" ({detail})") if failed else f"PASS ({detail})"
    name = "gpu-correct.sh with prefill's first token: text equal OFF's, opened by prefill"
    return [Verdict(name, 43, figure, not failed)]


def verdicts(out: Path, sweep_data: Mapping[str, Any] | None) -> list[Verdict]:
    """Every target of the wave, in the issues' order; `sweep_data` is wavereport's sweep table."""

    def part(name: str) -> dict[str, Any] | None:
        return _json(out / name / "summary.json")

    suffix = part("suffix2k")
    rows = (sweep_data or {}).get("rows", [])
    return [
        sweep_longest_p99(part("sweep")),
        overcommit(part("overcommit")),
        over_bound(suffix, "on", f"2k-token suffixes: ON/bound <= {BOUND}x"),
        over_bound(suffix, "dp", f"2k-token suffixes, the D->P path itself: D->P/bound <= {BOUND}x"),
        first_turns(rows),
        growth((sweep_data or {}).get("on_growth_8k_24k")),
        tpot(_json(out / "tpot" / "decode-local.json")),
        switch_streams(part("tpot")),
        correct(_json(out / "correct" / "summary.json")),
        *correct_first(_json(out / "correct" / "summary.json")),
        *first_token(part("first")),
    ]


def first_token(summary: Mapping[str, Any] | None) -> list[Verdict]:
    """The part `first`, where it ran: the D->P path with prefill's first token over the
    bound, beside the same path with decode's."""
    if summary is None:
        return []
    return [
        over_bound(summary, "dp", f"2k-token suffixes, the D->P path (part `first`): D->P/bound <= {BOUND}x"),
        over_bound(summary, "dp-first", f"the same with prefill's first token (firstTokenFromPrefill): <= {BOUND}x"),
        over_bound(summary, "on-first", f"2k-token suffixes, ON with prefill's first token: ON/bound <= {BOUND}x"),
        steady_tpot(summary),
    ]


def steady_tpot(summary: Mapping[str, Any] | None) -> Verdict:
    """Whether decode under the switch (its logits processor; vLLM 0.26 then runs its V1 model
    runner) decodes as fast as without: the follow-ups' own time per token after their second
    chunk, `on-first` over `on`, with the whole answers' latency beside it."""
    name = f"prefill's first token: TPOT after the second token up by at most {TPOT_RISE:.0%} (on-first/on)"
    tpot = _ratios(summary, "on-first", "on", "steady_tpot_p50")
    latency = _ratios(summary, "on-first", "on", "latency_p50")
    if not tpot:
        return Verdict(name, 43, "-", None)
    figure = ", ".join(f"{_x(t)} at {n // 1000}k (whole answer {_x(latency.get(n))})" for n, t in tpot.items())
    return Verdict(name, 43, figure, all(t <= 1 + TPOT_RISE for t in tpot.values()))


def switch_streams(summary: Mapping[str, Any] | None) -> Verdict:
    """Decode's streams under the switch: the tpot part's D->P turns with 3 streams decoding, its
    `dp-first` leg (prefill's first token; vLLM 0.26 then runs decode on its V1 model runner) over
    `dp`, the streams' TPOT p90 per point (history and suffix)."""
    name = f"prefill's first token: the streams' TPOT p90 up by at most {TPOT_RISE:.0%} (tpot, dp-first/dp)"
    ratios = _keyed_ratios(summary, "dp-first", "dp", "tpot_p90", _prefix_and_suffix)
    rises = {k: r - 1 for k, r in ratios.items()}
    if not rises:
        return Verdict(name, 43, "-", None)
    figure = ", ".join(f"{r:+.0%} at {s} new tokens" for (_, s), r in rises.items())
    return Verdict(name, 43, figure, all(r <= TPOT_RISE for r in rises.values()))


def _met(v: bool | None) -> str:
    return "-" if v is None else ("yes" if v else "**no**")


def markdown_table(items: Sequence[Verdict]) -> str:
    body = [(v.target, str(v.issue), v.figure, _met(v.met)) for v in items]
    return markdown(("target", "issue", "this run", "met"), body)


def to_json(items: Sequence[Verdict]) -> list[dict[str, Any]]:
    return [asdict(v) for v in items]
