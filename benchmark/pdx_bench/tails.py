"""The slowest follow-up turns of each leg and point, each split into the router's time, the
prefill hop and the decode hop.

A point's p99 over a few dozen turns is its slowest one or two, so where those turns spent their
time says which side to look at. On the H100's overcommit point (docs/results/h100-2026-12-06e-wave)
ON's slowest turns were `released` ones whose decode hop took up to 3 s, where OFF's took 50-67 ms;
the point table's p99 alone could not say so.
"""

from __future__ import annotations

from collections.abc import Sequence

from .points import PointKey, cell, point_key
from .records import RequestRecord
from .report import markdown

SHOWN = 3  # turns per leg and point

HEADERS = (
    "leg", "prefix", "suffix", "live", "rank", "conversation", "turn", "outcome", "TTFT", "router", "prefill hop",
    "decode hop",
)  # fmt: skip


def slowest(records: Sequence[RequestRecord], shown: int = SHOWN, min_turn: int = 2) -> list[RequestRecord]:
    """Each point's `shown` slowest follow-up turns, points in the order they ran, slowest first."""
    points: dict[PointKey, list[RequestRecord]] = {}
    for r in sorted(records, key=lambda r: r.start_time_ms):
        if r.turn >= min_turn:
            points.setdefault(point_key(r), []).append(r)
    return [r for turns in points.values() for r in sorted(turns, key=lambda r: -r.ttft_ms)[:shown]]


def rows(records: Sequence[RequestRecord], shown: int = SHOWN) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    rank = 0
    last: PointKey | None = None
    for r in slowest(records, shown):
        key = point_key(r)
        rank = rank + 1 if key == last else 1
        last = key
        leg, prefix, suffix, live = key
        out.append(
            (
                leg,
                str(prefix),
                "-" if suffix is None else str(suffix),
                "-" if live is None else str(live),
                str(rank),
                r.conversation_id,
                str(r.turn),
                r.reuse or "-",
                cell(r.ttft_ms),
                cell(r.router_ms),
                cell(r.prefill_ms),
                cell(r.decode_hop_ms),
            )
        )
    return out


NOTE = (
    f"The {SHOWN} slowest follow-up turns (turn >= 2) of each leg and point, ms. router: its X-PDX-Router-Ms "
    "(its own time before the first hop: planning, the claim gate's wait, the claim); prefill hop: its "
    "X-PDX-Prefill-Ms (0 for a turn prefilled on decode); decode hop: TTFT - router - prefill hop. "
    "`-`: the router sent no such header."
)


def markdown_table(records: Sequence[RequestRecord], shown: int = SHOWN) -> str:
    return f"{markdown(HEADERS, rows(records, shown))}\n\n{NOTE}"
