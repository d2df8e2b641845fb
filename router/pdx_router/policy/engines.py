"""Which engines serve a turn: one generation, a prefill (the conversation's own with prefill
affinity, else the least loaded), and the decode that holds the conversation's KV when it can.

A draining decode (being scaled away) is chosen for nothing: its conversations' next turns
read their KV from it (see `reuse.check_entry`) and decode elsewhere, which moves them."""

from __future__ import annotations

import hashlib
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


def _weight(key: str, engine: Endpoint) -> bytes:
    """Rendezvous (highest random weight) hashing's score of an engine for a key: its name
    (the pod's, stable across restarts), else its URL."""
    return hashlib.blake2b(f"{key}\x00{engine.name or engine.url}".encode(), digest_size=8).digest()


def affine(candidates: Sequence[Endpoint], key: str) -> Endpoint | None:
    """The candidate a key belongs to: the highest score. Every router replica picks the same
    one with no shared state, and when a prefill comes or goes only the keys it wins or held
    move (1/n of them), not the others."""
    return max(candidates, key=lambda e: _weight(key, e), default=None)


def choose_prefill(endpoints: Sequence[Endpoint], generation: str, affinity: str | None = None) -> Endpoint | None:
    """The prefill that served the conversation's earlier turns when `affinity` (its key) is
    given, so prefill's prefix cache may still hold its history; else the least loaded."""
    candidates = _healthy(endpoints, "prefill", generation)
    if affinity is not None:
        return affine(candidates, affinity)
    return least_loaded(candidates)


def choose_decode(endpoints: Sequence[Endpoint], generation: str, affinity_url: str | None) -> Endpoint | None:
    """The decode holding the conversation's KV if usable, else least outstanding."""
    candidates = _healthy(endpoints, "decode", generation)
    if affinity_url is not None:
        for e in candidates:
            if e.url == affinity_url:
                return e
    return least_loaded(candidates)
