"""Which engines serve a turn: one generation, the least loaded prefill, and the decode that
holds the conversation's KV when it can.

A draining decode (being scaled away) is chosen for nothing: its conversations' next turns
read their KV from it (see `reuse.check_entry`) and decode elsewhere, which moves them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from ..endpoints import Endpoint


def _healthy(endpoints: Iterable[Endpoint], role: str, generation: str) -> list[Endpoint]:
    """The engines that may take a turn."""
    return [e for e in endpoints if e.role == role and e.healthy and not e.draining and e.generation == generation]


def choose_generation(endpoints: Sequence[Endpoint], preferred: str) -> str | None:
    """The generation to serve from: the configured one if it has a healthy pair, else the
    generation with the most healthy pairs (during a rollout), else None."""
    if _healthy(endpoints, "prefill", preferred) and _healthy(endpoints, "decode", preferred):
        return preferred
    prefill = Counter(e.generation for e in endpoints if e.role == "prefill" and e.healthy and not e.draining)
    decode = Counter(e.generation for e in endpoints if e.role == "decode" and e.healthy and not e.draining)
    pairs = {g: min(prefill[g], decode[g]) for g in prefill if decode[g] > 0}
    if not pairs:
        return None
    # Most pairs wins; ties broken by name so every replica picks the same one.
    return max(sorted(pairs), key=lambda g: pairs[g])


def least_loaded(candidates: Sequence[Endpoint]) -> Endpoint | None:
    """Least outstanding requests; first in list order on ties (stable, predictable)."""
    best: Endpoint | None = None
    for e in candidates:
        if best is None or e.outstanding < best.outstanding:
            best = e
    return best


def choose_prefill(endpoints: Sequence[Endpoint], generation: str) -> Endpoint | None:
    return least_loaded(_healthy(endpoints, "prefill", generation))


def choose_decode(endpoints: Sequence[Endpoint], generation: str, affinity_url: str | None) -> Endpoint | None:
    """The decode holding the conversation's KV if usable, else least outstanding."""
    candidates = _healthy(endpoints, "decode", generation)
    if affinity_url is not None:
        for e in candidates:
            if e.url == affinity_url:
                return e
    return least_loaded(candidates)
