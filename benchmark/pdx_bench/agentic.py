"""The agentic mix's report (`--suffix-mix`): per suffix bucket, how follow-up turns went and how
far ON stayed from its bound (pure).

Each follow-up turn of a mix has its own suffix (records' `suffix_tokens`, drawn from the mix), so
rows are the mix's buckets (and `all`), per leg and prefix length. The outcome mix counts the
router's `X-PDX-Reuse` per turn in four classes: `local` (prefilled on the decode that holds the
conversation), `D->P` (`hit`: prefill read decode's KV), `released` (decode released the held KV
under memory pressure; recomputed) and `recompute` (every other outcome: miss, expired, declined,
prefix_mismatch, below_threshold, none). The bound is the one `pdx bench` measures for
`--suffix-tokens`: the same turns (other words, same sizes: a mix's draw does not depend on the
texts) sent whole to the decode that holds the conversation; a bucket's bound is its own turns'.
OFF's turns are the same sizes too, so OFF/ON compares a bucket's turns with themselves.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from .records import RequestRecord
from .report import cell, markdown, percentile
from .workload import SuffixMix

CLASSES = ("local", "D->P", "recompute", "released")
ALL = "all"
SIDE_LEGS = ("off", "bound")  # legs read beside the others, not rows of their own


def outcome_class(reuse: str | None) -> str:
    if reuse == "local":
        return "local"
    if reuse == "hit":
        return "D->P"
    if reuse == "released":
        return "released"
    return "recompute"


@dataclass(frozen=True)
class BucketRow:
    leg: str
    prefix_tokens: int
    bucket: str  # the mix's bucket label (`100-512`), or `all`
    n: int  # follow-up turns of the leg in the bucket
    outcomes: dict[str, int]  # per class (CLASSES)
    ttft_p50: float
    ttft_p90: float
    new_tokens_p50: float  # the drawn suffixes' median
    off_n: int = 0
    off_p50: float = float("nan")
    bound_n: int = 0
    bound_p50: float = float("nan")

    @property
    def off_over_on(self) -> float:
        return self.off_p50 / self.ttft_p50 if self.ttft_p50 > 0 else float("nan")

    @property
    def on_over_bound(self) -> float:
        return self.ttft_p50 / self.bound_p50 if self.bound_p50 > 0 else float("nan")

    def share(self, cls: str) -> float:
        return self.outcomes.get(cls, 0) / self.n if self.n else float("nan")


def _p50(records: Sequence[RequestRecord]) -> float:
    return percentile([r.ttft_ms for r in records], 50)


def bucket_rows(records: Sequence[RequestRecord], mix: SuffixMix) -> list[BucketRow]:
    """A row per leg (other than OFF and the bound, which stand beside it), prefix length and
    bucket with follow-up turns, then the leg and length's `all`; legs in the order they ran."""
    followups = [r for r in records if r.turn >= 2 and r.suffix_mix is not None and r.suffix_tokens is not None]
    legs: list[str] = []
    for r in sorted(followups, key=lambda r: r.start_time_ms):
        if r.leg not in legs and r.leg not in SIDE_LEGS:
            legs.append(r.leg)
    if not legs and any(r.leg == "off" for r in followups):
        legs = ["off"]  # an OFF-only run: its own rows
    out: list[BucketRow] = []
    for leg in legs:
        for length in sorted({r.prefix_tokens for r in followups if r.leg == leg}):
            at = [r for r in followups if r.prefix_tokens == length]
            groups = [(b.label, b.low, b.high) for b in mix.buckets] + [(ALL, 0, 1 << 62)]
            for label, low, high in groups:

                def inside(r: RequestRecord, lo: int = low, hi: int = high) -> bool:
                    return r.suffix_tokens is not None and lo <= r.suffix_tokens < hi

                mine = [r for r in at if r.leg == leg and inside(r)]
                if not mine:
                    continue
                off = [r for r in at if r.leg == "off" and inside(r)] if leg != "off" else []
                bound = [r for r in at if r.leg == "bound" and inside(r)]
                counts = Counter(outcome_class(r.reuse) for r in mine)
                out.append(
                    BucketRow(
                        leg=leg,
                        prefix_tokens=length,
                        bucket=label,
                        n=len(mine),
                        outcomes={c: counts.get(c, 0) for c in CLASSES},
                        ttft_p50=_p50(mine),
                        ttft_p90=percentile([r.ttft_ms for r in mine], 90),
                        new_tokens_p50=percentile([float(r.suffix_tokens or 0) for r in mine], 50),
                        off_n=len(off),
                        off_p50=_p50(off) if off else float("nan"),
                        bound_n=len(bound),
                        bound_p50=_p50(bound) if bound else float("nan"),
                    )
                )
    return out


HEADERS = (
    "leg", "prefix", "suffix bucket", "n", "suffix p50", "local", "D->P", "recompute", "released",
    "TTFT p50", "TTFT p90", "OFF p50", "OFF/ON", "bound p50", "ON/bound",
)  # fmt: skip


def table_rows(rows: Sequence[BucketRow]) -> list[tuple[str, ...]]:
    return [
        (
            r.leg,
            str(r.prefix_tokens),
            r.bucket,
            str(r.n),
            cell(r.new_tokens_p50),
            *(f"{r.outcomes[c]} ({100 * r.share(c):.0f}%)" if r.outcomes[c] else "0" for c in CLASSES),
            cell(r.ttft_p50),
            cell(r.ttft_p90),
            cell(r.off_p50),
            cell(r.off_over_on, "{:.2f}x"),
            cell(r.bound_p50),
            cell(r.on_over_bound, "{:.2f}x"),
        )
        for r in rows
    ]


def note(mix: SuffixMix) -> str:
    return (
        f"Follow-up turns (turn >= 2) of the mix {mix.describe()}, by the bucket their suffix was drawn "
        "from (low inclusive, high exclusive); TTFT in ms. Outcomes per X-PDX-Reuse: local (prefilled on "
        "decode), D->P (hit: prefill read decode's KV), recompute (miss, expired, declined, prefix_mismatch, "
        "below_threshold, none), released (decode released the held KV under pressure). OFF p50: the same "
        "turns (same sizes) with bidirectional off. bound: the same turns (other words, same sizes) sent "
        "whole to the decode that holds the conversation. `-`: not measured."
    )


def markdown_table(rows: Sequence[BucketRow], mix: SuffixMix) -> str:
    return f"{markdown(HEADERS, table_rows(rows))}\n\n{note(mix)}"


def to_json(rows: Sequence[BucketRow], mix: SuffixMix) -> dict[str, object]:
    def num(v: float) -> float | None:
        return None if v != v else v

    return {
        "mix": mix.describe(),
        "buckets": [{"label": b.label, "low": b.low, "high": b.high, "weight": b.weight} for b in mix.buckets],
        "rows": [
            {
                "leg": r.leg,
                "prefix_tokens": r.prefix_tokens,
                "bucket": r.bucket,
                "n": r.n,
                "suffix_p50": num(r.new_tokens_p50),
                "outcomes": r.outcomes,
                "ttft_p50": num(r.ttft_p50),
                "ttft_p90": num(r.ttft_p90),
                "off_n": r.off_n,
                "off_p50": num(r.off_p50),
                "off_over_on": num(r.off_over_on),
                "bound_n": r.bound_n,
                "bound_p50": num(r.bound_p50),
                "on_over_bound": num(r.on_over_bound),
            }
            for r in rows
        ],
    }
