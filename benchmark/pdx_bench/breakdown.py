"""Where ON's TTFT goes: the router's two hops beside each engine's own figures (pure).

The client measures TTFT through the router; the router reports its own time before its first
hop (`X-PDX-Router-Ms`: planning, the claim gate, the claim on decode's hold) and its prefill hop
(`X-PDX-Prefill-Ms`, the D->P read included). What is left is the decode hop: TTFT - both
(decode's P->D read, its first token, and the router's stream on the way). Each engine
adds what it counted itself (enginemetrics): its TTFT from the request's arrival in the engine,
after the API server rendered and tokenized it; its queue and prefill time; the NIXL transfers
it initiated. A hop less its engine's TTFT is what the API server and HTTP took around it.

vLLM schedules a request that loads KV asynchronously only once the KV has arrived, so an
engine's queue time contains the NIXL read it waited for; engine TTFT is about queue + prefill.

Engine figures are means per observation (`_sum / _count` of the difference between two
scrapes). With one client they cover the follow-up turns alone (scraped around each request),
as the TTFT table does; otherwise the whole group ("all turns"), and the router's figures
beside them then cover all turns too, so the subtraction stays within one set of requests.

Every figure of a row comes from one population. A turn prefilled on decode (`local`) has no
prefill hop (the router reports 0 ms) and prefill's engine never sees it, so turns that took
the two paths get a row each: `prefill` (a D->P read or a recompute through prefill) and
`local`. Under load, the first turns (through prefill) and decode-local follow-ups once shared
an `all turns` row: its prefill hop averaged 0s of local turns against prefill's engine TTFT of
the first turns alone, and API+HTTP came out at -3,335 ms (issue 43). With one client the
engines' windows are summed per path; with group windows, a role whose window mixes both paths
(decode, serving every turn) is left blank in both rows rather than read against either.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .enginemetrics import (
    COPIES,
    POST_TIME,
    PREFILL_TIME,
    QUEUE_TIME,
    TTFT,
    XFER_TIME,
    GroupEngines,
    Histograms,
    Snapshot,
)
from .records import RequestRecord, path_of
from .report import percentile

FOLLOWUPS = "turns >= 2"
ALL_TURNS = "all turns"
PATHS = ("prefill", "local")  # through prefill (hit, recompute, released...); prefilled on decode
ON_LEGS = ("on", "run", "")
BOUND = "bound"

# short key -> histogram, in the order the tables show them
ROLE_METRICS: tuple[tuple[str, str], ...] = (
    ("ttft", TTFT),
    ("queue", QUEUE_TIME),
    ("prefill", PREFILL_TIME),
    ("xfer", XFER_TIME),
    ("post", POST_TIME),
)


@dataclass(frozen=True)
class Figure:
    """One histogram over a window: mean per observation in ms, and how many were observed.

    count None: the engines do not export it (or were not scraped); mean None as well then,
    and when nothing was observed (count 0). Never a 0 that was not measured.
    """

    mean_ms: float | None = None
    count: float | None = None


def figure(hists: Histograms | None, metric: str) -> Figure:
    hist = hists.get(metric) if hists is not None else None
    if hist is None:
        return Figure()
    return Figure(hist.sum * 1000 / hist.count if hist.count > 0 else None, hist.count)


def role_figures(hists: Histograms | None) -> dict[str, Figure]:
    return {key: figure(hists, metric) for key, metric in ROLE_METRICS}


def scope_of(engines: GroupEngines | None) -> str:
    """Follow-up turns when the engines were scraped around each request; all turns when only
    around the group; follow-up turns (router figures alone) when they were not scraped."""
    if engines is None or engines.followups is not None:
        return FOLLOWUPS
    return ALL_TURNS if any(v is not None for v in engines.all_turns.values()) else FOLLOWUPS


def window(engines: GroupEngines | None, scope: str) -> Snapshot:
    """The engines' differences over `scope`; empty (every role blank) when not measured so."""
    if engines is None:
        return {}
    if scope == FOLLOWUPS:
        return engines.followups or {}
    return engines.all_turns


def path_window(engines: GroupEngines | None, scope: str, path: str, paths: set[str]) -> Snapshot:
    """The engines' differences over the turns of one path in `scope` (`paths`: the paths its turns
    took). One path: the scope's window. Two: the follow-ups' per-path sums when scraped per
    request; else prefill's window is the prefill path's (prefill never sees a local turn) and
    decode's, which mixes both, is blank."""
    whole = window(engines, scope)
    if len(paths) <= 1 or not whole:
        return whole
    if scope == FOLLOWUPS and engines is not None and engines.followups_by_path is not None:
        return engines.followups_by_path.get(path, {})
    return {"prefill": whole.get("prefill")} if path == "prefill" else {}


def in_scope(records: Sequence[RequestRecord], scope: str) -> list[RequestRecord]:
    return [r for r in records if scope == ALL_TURNS or r.turn >= 2]


def less(a: float | None, b: float | None) -> float | None:
    """a - b, blank when either is."""
    return None if a is None or b is None else a - b


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def mean_of(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def hop_means(recs: Sequence[RequestRecord]) -> tuple[float | None, float | None, float | None]:
    """The router's own time, the prefill hop and the decode hop, means over the turns whose
    router reported its prefill hop."""
    hops = [r for r in recs if r.prefill_ms is not None]
    return (
        mean_of([r.router_ms for r in hops if r.router_ms is not None]),
        mean_of([r.prefill_ms for r in hops if r.prefill_ms is not None]),
        mean_of([d for r in hops if (d := r.decode_hop_ms) is not None]),
    )


@dataclass(frozen=True)
class Hops:
    """A group of turns' two hops through the router beside each engine's own figures. Times in ms."""

    n: int
    ttft_p50: float | None
    ttft_mean: float | None
    router: float | None  # mean X-PDX-Router-Ms: the router's own time before its first hop
    prefill_hop: float | None  # mean X-PDX-Prefill-Ms
    decode_hop: float | None  # mean of TTFT - X-PDX-Router-Ms - X-PDX-Prefill-Ms
    prefill: dict[str, Figure]  # the prefill engines' own figures (xfer: D->P reads)
    decode: dict[str, Figure]  # the decode engines' (xfer: P->D reads)

    @property
    def prefill_api_ms(self) -> float | None:
        """The prefill hop less prefill's engine TTFT: router->prefill HTTP, its API server."""
        return less(self.prefill_hop, self.prefill["ttft"].mean_ms)

    @property
    def decode_api_ms(self) -> float | None:
        """The decode hop less decode's engine TTFT: HTTP, decode's API server, the router's stream."""
        return less(self.decode_hop, self.decode["ttft"].mean_ms)

    def hops_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "ttft_p50_ms": self.ttft_p50,
            "ttft_mean_ms": self.ttft_mean,
            "router_ms": self.router,
            "prefill_hop_ms": self.prefill_hop,
            "prefill_engine": figures_json(self.prefill),
            "prefill_api_http_ms": self.prefill_api_ms,
            "decode_hop_ms": self.decode_hop,
            "decode_engine": figures_json(self.decode),
            "decode_api_http_ms": self.decode_api_ms,
        }


def figures_json(figs: Mapping[str, Figure]) -> dict[str, Any]:
    return {k: {"mean_ms": v.mean_ms, "count": v.count} for k, v in figs.items()}


@dataclass(frozen=True)
class Breakdown(Hops):
    """One prefix length of the ON leg, next to its bound."""

    length: int
    scope: str
    bound_n: int = 0
    bound_p50: float | None = None
    bound_mean: float | None = None
    bound_decode: dict[str, Figure] | None = None  # decode's own figures while it served the bound
    path: str = "prefill"  # the turns of this row: through prefill, or `local` (prefilled on decode)

    @property
    def bound_api_ms(self) -> float | None:
        return less(self.bound_mean, self.bound_decode["ttft"].mean_ms if self.bound_decode else None)

    @property
    def on_over_bound(self) -> float | None:
        """ON's median TTFT over the bound's: how far from the decode-only lower bound."""
        return ratio(self.ttft_p50, self.bound_p50)

    def to_json(self) -> dict[str, Any]:
        return {
            "length": self.length,
            "scope": self.scope,
            "path": self.path,
            **self.hops_json(),
            "bound": {
                "n": self.bound_n,
                "ttft_p50_ms": self.bound_p50,
                "ttft_mean_ms": self.bound_mean,
                "decode_engine": None if self.bound_decode is None else figures_json(self.bound_decode),
                "api_http_ms": self.bound_api_ms,
            },
            "on_over_bound": self.on_over_bound,
        }


def turn_key(r: RequestRecord) -> tuple[int, int | None, str, int]:
    """What pairs a turn with the same turn of another leg (the bound's): point, conversation
    index (ids end in `-c<index>`), turn."""
    return (r.prefix_tokens, r.suffix_tokens, r.conversation_id.rsplit("-c", 1)[-1], r.turn)


def breakdown(
    length: int,
    on_records: Sequence[RequestRecord],
    on_engines: GroupEngines | None,
    bound_records: Sequence[RequestRecord] = (),
    bound_engines: GroupEngines | None = None,
    path: str | None = None,
) -> Breakdown:
    """One length (and one path: `prefill`, `local`; None: the path all its turns took): the ON
    leg's records and engine differences, and the bound's, if measured. With a path, the bound's
    turns are those paired with this path's turns (same conversation index and turn)."""
    scope = scope_of(on_engines)
    everything = in_scope(on_records, scope)
    paths = {path_of(r.reuse) for r in everything}
    if path is None:
        path = next(iter(paths)) if len(paths) == 1 else "prefill"
    recs = [r for r in everything if path_of(r.reuse) == path] if len(paths) > 1 else everything
    ttft = [r.ttft_ms for r in recs]
    router, prefill_hop, decode_hop = hop_means(recs)
    engines = path_window(on_engines, scope, path, paths)
    bound = in_scope(bound_records, scope)
    if len(paths) > 1:
        mine = {turn_key(r) for r in recs}
        bound = [r for r in bound if turn_key(r) in mine]
    bound_ttft = [r.ttft_ms for r in bound]
    measured = bound_engines is not None and len(paths) <= 1  # the bound's window is not split by path
    local = path == "local"  # no prefill hop: the router reports 0 ms and prefill never sees the turn
    return Breakdown(
        length=length,
        scope=scope,
        n=len(recs),
        ttft_p50=percentile(ttft, 50) if ttft else None,
        ttft_mean=mean_of(ttft),
        router=router,
        prefill_hop=None if local else prefill_hop,
        decode_hop=decode_hop,
        prefill=role_figures(None if local else engines.get("prefill")),
        decode=role_figures(engines.get("decode")),
        bound_n=len(bound),
        bound_p50=percentile(bound_ttft, 50) if bound_ttft else None,
        bound_mean=mean_of(bound_ttft),
        bound_decode=role_figures(window(bound_engines, scope).get("decode")) if measured else None,
        path=path,
    )


def breakdowns(records: Sequence[RequestRecord], engines: Mapping[str, Mapping[int, GroupEngines]]) -> list[Breakdown]:
    """Every length of the ON leg (`on`, or `run` for --url), a row per path its turns took;
    `engines` is per leg, per length."""
    on = [r for r in records if r.leg in ON_LEGS]
    legs = {r.leg for r in on}
    on_engines: dict[int, GroupEngines] = {}
    for leg in legs:
        on_engines.update(engines.get(leg, {}))
    bound = [r for r in records if r.leg == BOUND]
    out = []
    for length in sorted({r.prefix_tokens for r in on}):
        mine = [r for r in on if r.prefix_tokens == length]
        paths = {path_of(r.reuse) for r in in_scope(mine, scope_of(on_engines.get(length)))}
        chosen: list[str | None] = [p for p in PATHS if p in paths]
        for path in chosen or [None]:
            out.append(
                breakdown(
                    length,
                    mine,
                    on_engines.get(length),
                    [r for r in bound if r.prefix_tokens == length],
                    engines.get(BOUND, {}).get(length),
                    path=path,
                )
            )
    return out


# ------------------------------------------------------------------------------- tables


def ms(v: float | None) -> str:
    return "-" if v is None or v != v else f"{v:.1f}"


def _x(v: float | None) -> str:
    return "-" if v is None or v != v else f"{v:.2f}x"


BREAKDOWN_HEADERS = (
    "prefix", "scope", "path", "n", "TTFT p50", "TTFT mean", "router",
    "prefill hop", "P engine TTFT", "P queue", "P prefill", "D->P xfer", "D->P post", "P API+HTTP",
    "decode hop", "D engine TTFT", "P->D xfer", "D API+HTTP",
    "bound p50", "bound D engine TTFT", "ON/bound",
)  # fmt: skip


def breakdown_rows(rows: Sequence[Breakdown]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for b in rows:
        p, d = b.prefill, b.decode
        out.append(
            (
                str(b.length), b.scope, b.path, str(b.n), ms(b.ttft_p50), ms(b.ttft_mean), ms(b.router),
                ms(b.prefill_hop), ms(p["ttft"].mean_ms), ms(p["queue"].mean_ms), ms(p["prefill"].mean_ms),
                ms(p["xfer"].mean_ms), ms(p["post"].mean_ms), ms(b.prefill_api_ms),
                ms(b.decode_hop), ms(d["ttft"].mean_ms), ms(d["xfer"].mean_ms), ms(b.decode_api_ms),
                ms(b.bound_p50), ms(b.bound_decode["ttft"].mean_ms if b.bound_decode else None), _x(b.on_over_bound),
            )
        )  # fmt: skip
    return out


ENGINE_HEADERS = ("leg", "prefix", "scope", "role", "TTFT", "queue", "prefill", "NIXL xfer", "NIXL post", "NIXL copies")


def _cell(f: Figure) -> str:
    if f.count is None:
        return "-"
    return f"{ms(f.mean_ms)} ({f.count:.0f})"


def copies(hists: Histograms | None) -> tuple[float | None, float | None]:
    """NIXL's copies per transfer the engine initiated (blocks after NIXL merged adjacent ones),
    and the transfers; (None, None) where not exported, mean None where nothing was moved."""
    hist = hists.get(COPIES) if hists is not None else None
    if hist is None:
        return None, None
    return (hist.sum / hist.count if hist.count > 0 else None), hist.count


def _copies_cell(hists: Histograms | None) -> str:
    mean, count = copies(hists)
    return "-" if count is None else f"{ms(mean)} ({count:.0f})"


def engine_rows(engines: Mapping[str, Mapping[int, GroupEngines]]) -> list[tuple[str, ...]]:
    """Each leg, length and role: every time as `mean ms (count)`, NIXL's copies per transfer as
    `mean (count)`, `-` where not exported."""
    out: list[tuple[str, ...]] = []
    for leg, by_length in engines.items():
        for length in sorted(by_length):
            scope = scope_of(by_length[length])
            for role, hists in sorted(window(by_length[length], scope).items()):
                figs = role_figures(hists)
                cells = (_cell(figs[k]) for k, _ in ROLE_METRICS)
                out.append((leg, str(length), scope, role, *cells, _copies_cell(hists)))
    return out


def engines_json(engines: Mapping[str, Mapping[int, GroupEngines]]) -> dict[str, Any]:
    """Per leg and length, both windows, per role: each figure's mean (ms) and count; null where
    not measured."""

    def snap(s: Snapshot | None) -> dict[str, Any] | None:
        if s is None:
            return None
        return {
            role: None
            if h is None
            else {
                **{k: {"mean_ms": f.mean_ms, "count": f.count} for k, f in role_figures(h).items()},
                "copies": dict(zip(("mean", "count"), copies(h), strict=True)),
            }
            for role, h in s.items()
        }

    return {
        leg: {str(length): {ALL_TURNS: snap(g.all_turns), FOLLOWUPS: snap(g.followups)} for length, g in by.items()}
        for leg, by in engines.items()
    }
