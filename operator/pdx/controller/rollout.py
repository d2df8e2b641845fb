"""Rollout policy (pure): which config generation the router may pair during a rollout.

vLLM reads the TTL, the threshold and the bidirectional switch only at engine start, and a
prefill and a decode of different configs must never serve one request together. So both
StatefulSets always get the new config hash in the same reconcile pass (one `render` call
gives both one hash), and the endpoints file the router reads lists the ready engines of
exactly one generation: the old one keeps serving until the new one has at least as many
ready prefill/decode pairs, then the file flips to the new one and never back (pods of the
new generation only grow, old ones only shrink, so the choice is monotone).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pdx.render import ready_engine
from pdx.render.meta import ROLES
from pdx_contract.endpoints import PublishedEndpoint


@dataclass(frozen=True)
class PodView:
    """The facts of one pod the policies need (built from the API object in `reconcile`)."""

    name: str
    role: str  # prefill, decode or router
    generation: str | None  # label pdx.dev/config-hash (engines only)
    ready: bool
    ip: str | None = None
    terminating: bool = False
    waiting_reason: str | None = None  # e.g. CrashLoopBackOff
    termination: str | None = None  # the container's last termination message

    @property
    def serving(self) -> bool:
        return self.ready and not self.terminating and bool(self.ip)

    @property
    def draining(self) -> bool:
        """A decode on its way out that still answers: the KV it holds can still be read."""
        return self.role == "decode" and self.ready and self.terminating and bool(self.ip)


def ready_counts(pods: Iterable[PodView]) -> dict[tuple[str, str], int]:
    """(role, generation) -> ready engine pods."""
    out: Counter[tuple[str, str]] = Counter()
    for p in pods:
        if p.role in ROLES and p.generation and p.serving:
            out[(p.role, p.generation)] += 1
    return dict(out)


def pairs(pods: Sequence[PodView], generation: str) -> int:
    """How many prefill/decode pairs of one generation are ready (the serving capacity)."""
    counts = ready_counts(pods)
    return min(counts.get(("prefill", generation), 0), counts.get(("decode", generation), 0))


def choose_generation(pods: Sequence[PodView], target: str) -> str:
    """The one generation the router may pair.

    The target generation as soon as it has a pair and at least the capacity of every other
    generation; until then the generation with the most pairs; with no pair anywhere the
    target (the router cannot pair anything, and the new pods are what will become ready).
    """
    gens = {p.generation for p in pods if p.generation}
    best_other, best_other_pairs = None, 0
    for gen in sorted(gens - {target}):
        n = pairs(pods, gen)
        if n > best_other_pairs:
            best_other, best_other_pairs = gen, n
    mine = pairs(pods, target)
    if best_other is None or (mine > 0 and mine >= best_other_pairs):
        return target
    return best_other


def endpoints(pods: Sequence[PodView], target: str) -> tuple[str, list[PublishedEndpoint]]:
    """The generation chosen and its ready engines, as the router's endpoints file lists them;
    a decode of that generation on its way out is listed as draining (it decodes nothing new,
    and its conversations' next turns read their KV from it and move)."""
    gen = choose_generation(pods, target)
    out = [
        ready_engine(p.role, p.name, p.ip, gen, draining=p.draining)
        for p in sorted(pods, key=lambda p: (p.role, p.name))
        if p.role in ROLES and p.generation == gen and (p.serving or p.draining) and p.ip
    ]
    return gen, out


def in_rollout(pods: Sequence[PodView], target: str) -> bool:
    """Engines of another generation still exist (ready or not)."""
    return any(p.role in ROLES and p.generation and p.generation != target and not p.terminating for p in pods)
