"""Per leg and point (prefix length, suffix): follow-up turns' TTFT, their outcomes, and the
background streams' TPOT while those turns ran.

The OFF/ON table pools a length's points and knows only the OFF and ON legs; a sweep of
suffixes, named legs or background streams is read here instead. The streams' TPOT is taken
during the follow-up turns only (each from its start to its last token): that is when a turn
prefilled on decode can delay them, and the first turns' full prefills are the same in every leg.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .background import StreamRecord, window_tpots
from .enginemetrics import COMPUTE, EXTERNAL, LOCAL_HIT, GroupEngines, sources
from .held import HeldFigures, overcommit
from .records import RequestRecord
from .report import INTERVAL, markdown, percentile, ratio_interval

# (leg, prefix length, suffix, live conversations): a point of a leg
PointKey = tuple[str, int, int | None, int | None]
OFF = "off"  # the leg every other leg's tail is read against, point by point


@dataclass(frozen=True)
class TokenSources:
    """Where the follow-up turns' prompt tokens came from on prefill, from its
    `vllm:prompt_tokens_by_source` over the point (all its turns): its own prefix cache, the
    D->P read, computed. The first turns' prompts are taken off the computed tokens: with
    `--unique-prefix` a first turn has nothing to reuse (with a shared system prompt, what a
    first turn found of it counts as the follow-ups' own hits)."""

    local: float
    remote: float
    computed: float

    @property
    def total(self) -> float:
        return self.local + self.remote + self.computed

    def share(self, part: float) -> float:
        return part / self.total if self.total > 0 else float("nan")


def token_sources(engines: GroupEngines | None, first_turn_tokens: float) -> TokenSources | None:
    """A point's sources on prefill (None: prefill's figures were not read, or not exported)."""
    prefill = engines.all_turns.get("prefill") if engines is not None else None
    got = sources(prefill) if prefill is not None else None
    if got is None:
        return None
    return TokenSources(got[LOCAL_HIT], got[EXTERNAL], max(0.0, got[COMPUTE] - first_turn_tokens))


@dataclass(frozen=True)
class PointStats:
    leg: str
    prefix_tokens: int
    suffix_tokens: int | None
    n: int  # follow-up turns answered
    ttft_p50: float
    ttft_p90: float
    outcomes: dict[str, int]  # X-PDX-Reuse of the follow-up turns ("-": no header)
    new_tokens: float | None  # median prompt tokens beyond what decode held (hits: prompt - reused)
    tpot_n: int = 0  # stream TPOTs taken (one per stream request and follow-up turn)
    tpot_p50: float = float("nan")
    tpot_p90: float = float("nan")
    itl_p99: float = float("nan")  # the streams' inter-token gaps during those turns
    tpots: tuple[float, ...] = ()  # the stream TPOTs taken, for intervals
    streams: int = 0  # background stream requests of the leg
    live: int | None = None  # conversations live at once (--live)
    sources: TokenSources | None = None  # where prefill's prompt tokens came from
    ttft_p99: float = float("nan")
    overcommit: float | None = None  # the point's held demand over decode's KV capacity
    held: HeldFigures | None = None  # decode's releases and requests that waited behind held KV
    ttfts: tuple[float, ...] = ()  # the follow-up turns' TTFTs, for intervals
    latency_p50: float = float("nan")  # the follow-up turns' whole answers
    steady_tpot_p50: float = float("nan")  # their own decode time per token after the second chunk

    def share(self, outcome: str) -> float:
        return self.outcomes.get(outcome, 0) / self.n if self.n else 0.0


def point_key(r: RequestRecord) -> PointKey:
    """A record's point; a suffix mix's turns (each its own suffix) are one point."""
    return (r.leg, r.prefix_tokens, None if r.suffix_mix else r.suffix_tokens, r.live_conversations)


def point_stats(
    records: Sequence[RequestRecord],
    streams: Sequence[StreamRecord] = (),
    min_turn: int = 2,
    engines: Mapping[PointKey, GroupEngines] | None = None,
    held_by_point: Mapping[PointKey, HeldFigures] | None = None,
    decode_capacity: Mapping[str, Sequence[int | None]] | None = None,
    shared_prefix: bool = False,
) -> list[PointStats]:
    """One row per (leg, prefix, suffix, live) with follow-up turns, in the order they ran;
    `engines`: each point's engine figures (for where prefill's tokens came from); `held_by_point`:
    decode's held-KV counters' change per point; `decode_capacity`: per leg, each decode's KV
    tokens (for the overcommit factor); `shared_prefix`: the conversations of a point share its
    prefix (one system prompt), which decode keeps once."""
    keys: list[PointKey] = []
    for r in sorted(records, key=lambda r: r.start_time_ms):
        key = point_key(r)
        if r.turn >= min_turn and key not in keys:
            keys.append(key)
    out = []
    for key in keys:
        leg, prefix, suffix, live = key
        everything = [r for r in records if point_key(r) == key]
        group = [r for r in everything if r.turn >= min_turn]
        first = sum(float(r.input_num_tokens) for r in records if point_key(r) == key and r.turn < min_turn)
        ttft = [r.ttft_ms for r in group]
        held = [float(r.input_num_tokens - r.reused_tokens) for r in group if r.reuse == "hit" and r.reused_tokens]
        leg_streams = [s for s in streams if s.leg == leg]
        tpots, gaps = window_tpots(leg_streams, [(r.start_time_ms, r.start_time_ms + r.latency_ms) for r in group])
        out.append(
            PointStats(
                leg=leg,
                prefix_tokens=prefix,
                suffix_tokens=suffix,
                n=len(group),
                ttft_p50=percentile(ttft, 50),
                ttft_p90=percentile(ttft, 90),
                outcomes=dict(Counter(r.reuse or "-" for r in group)),
                new_tokens=percentile(held, 50) if held else None,
                tpot_n=len(tpots),
                tpot_p50=percentile(tpots, 50),
                tpot_p90=percentile(tpots, 90),
                itl_p99=percentile(gaps, 99),
                tpots=tuple(tpots),
                streams=len(leg_streams),
                live=live,
                sources=token_sources((engines or {}).get(key), first),
                ttft_p99=percentile(ttft, 99),
                overcommit=overcommit(everything, (decode_capacity or {}).get(leg, ()), prefix if shared_prefix else 0),
                held=(held_by_point or {}).get(key),
                ttfts=tuple(ttft),
                latency_p50=percentile([r.latency_ms for r in group], 50),
                steady_tpot_p50=percentile([r.steady_tpot_ms for r in group if r.steady_tpot_ms is not None], 50),
            )
        )
    return out


def p99_over_off(p: PointStats, points: Sequence[PointStats]) -> tuple[float, float, float] | None:
    """``p``'s follow-up TTFT p99 over the `off` leg's at the same point, and the bootstrap interval
    of that ratio (`report.ratio_interval`); None for OFF itself or a point OFF did not run. A p99
    of a dozen turns is their slowest: which leg a machine's hiccup lands on moves it, and two runs
    of the CPU overcommit point at 2x gave 2.13x and 0.93x pooled (docs/results/cpu-2026-12-06d-router-time)."""
    where = (p.prefix_tokens, p.suffix_tokens, p.live)
    base = next((o for o in points if o.leg == OFF and (o.prefix_tokens, o.suffix_tokens, o.live) == where), None)
    if p.leg == OFF or base is None or not p.ttfts or not base.ttfts:
        return None
    low, high = ratio_interval(p.ttfts, base.ttfts, 99)
    return p.ttft_p99 / base.ttft_p99, low, high


def cell(v: float | None, fmt: str = "{:.0f}") -> str:
    """A table cell; `-` for what was not measured (None or NaN), never 0."""
    return "-" if v is None or v != v else fmt.format(v)


def outcome_mix(p: PointStats) -> str:
    """e.g. `hit 5, local 1`."""
    return ", ".join(f"{k} {v}" for k, v in sorted(p.outcomes.items())) or "-"


def source_mix(p: PointStats) -> str:
    """e.g. `62/30/8`: percent of the follow-ups' prompt tokens from prefill's cache, the D->P
    read, computed."""
    src = p.sources
    if src is None or src.total <= 0:
        return "-"
    return "/".join(f"{100 * src.share(part):.0f}" for part in (src.local, src.remote, src.computed))


HEADERS = (
    "leg", "prefix", "suffix", "live", "n", "TTFT p50", "TTFT p90", "TTFT p99", "p99/OFF", "outcomes",
    "P cache/D->P/computed %",
    "new tok", "TPOT p50", "TPOT p90", "ITL p99", "TPOT n", "overcommit", "released/shortened/waited/lapsed",
)  # fmt: skip


def held_cell(p: PointStats) -> str:
    return "-" if p.held is None else f"{p.held.releases}/{p.held.trims}/{p.held.waited}/{p.held.lapsed}"


def _vs_off(p: PointStats, points: Sequence[PointStats]) -> str:
    got = p99_over_off(p, points)
    return "-" if got is None else f"{got[0]:.2f} ({got[1]:.2f}-{got[2]:.2f})"


def table_rows(points: Sequence[PointStats]) -> list[tuple[str, ...]]:
    return [
        (
            p.leg,
            str(p.prefix_tokens),
            "-" if p.suffix_tokens is None else str(p.suffix_tokens),
            "-" if p.live is None else str(p.live),
            str(p.n),
            cell(p.ttft_p50),
            cell(p.ttft_p90),
            cell(p.ttft_p99),
            _vs_off(p, points),
            outcome_mix(p),
            source_mix(p),
            cell(p.new_tokens),
            cell(p.tpot_p50, "{:.2f}"),
            cell(p.tpot_p90, "{:.2f}"),
            cell(p.itl_p99, "{:.1f}"),
            str(p.tpot_n),
            cell(p.overcommit, "{:.1f}x"),
            held_cell(p),
        )
        for p in points
    ]


NOTE = (
    "Follow-up turns (turn >= 2) of each leg and point, ms. live: conversations live at once (--live). "
    f"p99/OFF: TTFT p99 over the off leg's at the point, with its {INTERVAL:.0%} bootstrap interval. outcomes: "
    "X-PDX-Reuse per turn. P cache/D->P/computed: the follow-ups' prompt tokens on prefill by where their KV "
    "came from (vllm:prompt_tokens_by_source over the point, the first turns' prompts taken off computed). "
    "new tok: median "
    "prompt tokens beyond what decode held (hits: prompt - reused). TPOT: the background streams' mean time per "
    "token during each follow-up turn (one value per stream request and turn, at least 4 gaps); ITL p99: their "
    "inter-token gaps during those turns; TPOT n: how many values. overcommit: the point's conversations' "
    "longest turns (prompt + answer) over decode's KV capacity. released/shortened/waited/lapsed: holds decode "
    "released and shortened under pressure, requests it refused blocks while it kept held KV, and holds released "
    "after their claim's lease ran out (a drop that never came), during the point (its POST /v1/pdx/holds). "
    "`-`: not measured."
)


def markdown_table(points: Sequence[PointStats]) -> str:
    return f"{markdown(HEADERS, table_rows(points))}\n\n{NOTE}"


def to_json(p: PointStats, points: Sequence[PointStats] = ()) -> dict[str, object]:
    """A point's row; with every point of the run, its p99 over OFF's (`p99_over_off`) too."""

    def num(v: float | None) -> float | None:
        return None if v is None or v != v else v

    vs_off = p99_over_off(p, points)

    return {
        "leg": p.leg,
        "prefix_tokens": p.prefix_tokens,
        "suffix_tokens": p.suffix_tokens,
        "n": p.n,
        "ttft_p50": num(p.ttft_p50),
        "ttft_p90": num(p.ttft_p90),
        "outcomes": p.outcomes,
        "new_tokens": num(p.new_tokens),
        "tpot_n": p.tpot_n,
        "tpot_p50": num(p.tpot_p50),
        "tpot_p90": num(p.tpot_p90),
        "itl_p99": num(p.itl_p99),
        "background_requests": p.streams,
        "live": p.live,
        "ttft_p99": num(p.ttft_p99),
        "latency_p50": num(p.latency_p50),
        "steady_tpot_p50": num(p.steady_tpot_p50),
        "ttft_p99_over_off": None
        if vs_off is None
        else {"ratio": num(vs_off[0]), "low": num(vs_off[1]), "high": num(vs_off[2])},
        "overcommit": p.overcommit,
        "releases": None if p.held is None else p.held.releases,
        "trims": None if p.held is None else p.held.trims,
        "waited_on_held": None if p.held is None else p.held.waited,
        "lapsed_claims": None if p.held is None else p.held.lapsed,
        "sources": None
        if p.sources is None
        else {"local": p.sources.local, "remote": p.sources.remote, "computed": p.sources.computed},
    }
