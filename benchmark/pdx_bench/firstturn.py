"""Where each leg's first turns spend their TTFT, engine by engine (pure).

A first turn has nothing to reuse, yet in one H100 wave ON's first turns came 3-5% above OFF's at
16k-32k tokens, all of it on decode's hop (issue 43; two more runs showed it to be run-to-run
noise, docs/results/h100-2026-12-06c-first-turns). The follow-up breakdown (breakdown.py) shows
only ON's follow-ups, so it cannot say which part of decode's hop grows. This one puts
every leg's first turns side by side: the router's two hops, and within each the engine's own
TTFT, queue (decode's P->D read waits in it) and prefill, the NIXL reads and their posting, and
what is left for the API server and HTTP. Engine figures come from scrapes around each first
turn (one client); a leg scraped otherwise shows its router figures alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .breakdown import BOUND, Hops, hop_means, mean_of, ms, role_figures
from .enginemetrics import GroupEngines
from .records import RequestRecord
from .report import percentile


@dataclass(frozen=True)
class FirstTurns(Hops):
    """One leg's first turns at one prefix length."""

    leg: str
    length: int

    def to_json(self) -> dict[str, Any]:
        return {"leg": self.leg, "length": self.length, **self.hops_json()}


def first_turns(
    records: Sequence[RequestRecord], engines: Mapping[str, Mapping[int, GroupEngines]]
) -> list[FirstTurns]:
    """A row per leg (the bound aside: it has no hops) and prefix length that has first turns."""
    out: list[FirstTurns] = []
    legs = list(dict.fromkeys(r.leg for r in records if r.leg != BOUND))
    for leg in legs:
        mine = [r for r in records if r.leg == leg and r.turn == 1]
        for length in sorted({r.prefix_tokens for r in mine}):
            recs = [r for r in mine if r.prefix_tokens == length]
            router, prefill_hop, decode_hop = hop_means(recs)
            group = engines.get(leg, {}).get(length)
            window = (group.first_turns if group is not None else None) or {}
            ttft = [r.ttft_ms for r in recs]
            out.append(
                FirstTurns(
                    leg=leg,
                    length=length,
                    n=len(recs),
                    ttft_p50=percentile(ttft, 50) if ttft else None,
                    ttft_mean=mean_of(ttft),
                    router=router,
                    prefill_hop=prefill_hop,
                    decode_hop=decode_hop,
                    prefill=role_figures(window.get("prefill")),
                    decode=role_figures(window.get("decode")),
                )
            )
    return out


HEADERS = (
    "leg", "prefix", "n", "TTFT p50", "TTFT mean", "router",
    "prefill hop", "P engine TTFT", "P queue", "P prefill", "P API+HTTP",
    "decode hop", "D engine TTFT", "D queue", "D prefill", "P->D xfer", "P->D post", "D API+HTTP",
)  # fmt: skip

NOTE = (
    "First turns (turn 1) of every leg, ms; TTFT p50 and mean are the client's, hops and engine figures "
    "means. router: X-PDX-Router-Ms, its own time before the first hop; prefill hop: its "
    "X-PDX-Prefill-Ms; decode hop: TTFT - router - prefill hop. Engine figures: "
    "vLLM's own histograms summed around each first turn (one client; `-` otherwise): TTFT from the "
    "request's arrival in the engine, queue (decode's P->D read waits in it), prefill; P->D xfer/post: "
    "the NIXL reads decode initiated, mean per read. API+HTTP: a hop less its engine's TTFT."
)


def rows(table: Sequence[FirstTurns]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for t in table:
        p, d = t.prefill, t.decode
        out.append(
            (
                t.leg, str(t.length), str(t.n), ms(t.ttft_p50), ms(t.ttft_mean), ms(t.router),
                ms(t.prefill_hop), ms(p["ttft"].mean_ms), ms(p["queue"].mean_ms), ms(p["prefill"].mean_ms),
                ms(t.prefill_api_ms),
                ms(t.decode_hop), ms(d["ttft"].mean_ms), ms(d["queue"].mean_ms), ms(d["prefill"].mean_ms),
                ms(d["xfer"].mean_ms), ms(d["post"].mean_ms), ms(t.decode_api_ms),
            )
        )  # fmt: skip
    return out
