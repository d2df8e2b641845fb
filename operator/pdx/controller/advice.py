"""TTL advice (pure): a decoderKvBlocksTtlSeconds that covers the observed inter-turn gaps.

A turn reuses decode's blocks only if it comes back before the router's entry deadline,
which is the decoder TTL minus the router's margin. So the advice is the 95th percentile of
the gaps the router measured, plus headroom, plus that margin, rounded up to a step people
would type. Advice only: the operator reports it in status and never edits the spec.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from pdx.spec import ROUTER_TTL_MARGIN_SECONDS, ReuseStatus
from pdx_contract.stats import RouterStats

MIN_SAMPLES = 20  # fewer gaps than this say nothing about a p95
HEADROOM = 1.1  # p95 moves; 10 % keeps a recommendation from chasing every sample
STEP_SECONDS = 30
FLOOR_SECONDS = 60
# Decode holds finished turns' KV for the whole TTL; beyond an hour the memory cost of
# keeping blocks for conversations that may never return outweighs the recompute saved.
CAP_SECONDS = 3600


def recommend_ttl(
    p95_gap_seconds: float | None,
    samples: int,
    *,
    router_margin: int = ROUTER_TTL_MARGIN_SECONDS,
    min_samples: int = MIN_SAMPLES,
) -> int | None:
    """Decoder TTL (seconds) that would keep 95 % of returning turns reusable; None if unknown."""
    if p95_gap_seconds is None or samples < min_samples or p95_gap_seconds < 0 or math.isnan(p95_gap_seconds):
        return None
    raw = p95_gap_seconds * HEADROOM + router_margin
    stepped = math.ceil(raw / STEP_SECONDS) * STEP_SECONDS
    return max(FLOOR_SECONDS, min(CAP_SECONDS, stepped))


def reuse_status(raw: Mapping[str, Any]) -> ReuseStatus | None:
    """Status.reuse from the router's `GET /v1/pdx/stats` answer; None if it is not one."""
    try:
        stats = RouterStats.model_validate(raw)
    except ValidationError:
        return None
    reuse, gaps, held = stats.reuse, stats.inter_turn_gap_seconds, stats.held_kv
    with_entry = reuse.with_entry()
    return ReuseStatus(
        hit_rate=round(reuse.reused() / with_entry, 4) if with_entry else None,
        hits=reuse.reused(),
        expired=reuse.expired,
        released=reuse.released,
        recommended_ttl_seconds=recommend_ttl(gaps.p95, gaps.count) if gaps.count else None,
        valve_off=held.valve_off if held.decodes else None,
        waited=held.waited if held.decodes else None,
    )
