"""Engine endpoints as the router sees them: role, generation, health, load."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pdx_contract.endpoints import Role
from pdx_contract.holds import HoldsAnswer

__all__ = ["Endpoint", "Role"]

KNOWN_RELEASES = 4096  # hold ids a decode said it released early, remembered per decode


@dataclass(eq=False)
class Endpoint:
    """One engine. Mutable on purpose: health and outstanding count change per request."""

    url: str
    role: Role
    generation: str
    name: str = ""
    healthy: bool = True
    failures: int = 0  # consecutive failed health checks
    outstanding: int = 0
    block_size: int | None = None
    draining: bool = False  # decodes nothing; its entries are still read (see PublishedEndpoint)
    names_held: bool = False  # a decode whose last answer named the tokens it holds (kv_prefix)
    claims: bool | None = None  # answers claims on its held KV (policy.holds); False: no route, never asked again
    released_seq: int = 0  # the last release count its holds answers gave (the next claim's `since`)
    # holds it released early, oldest first: True where a younger hold covers the blocks (superseded)
    released: dict[str, bool] = field(default_factory=dict)
    # holds it shortened under pressure, oldest first: the leading tokens it still keeps of each
    kept: dict[str, int] = field(default_factory=dict)
    held_kv: HoldsAnswer | None = None  # a decode's answer to the last health check's holds poll
    # requests on it that are not this router's (other replicas'), as its load was last asked
    others_load: int | None = None
    load_seen: float = 0.0  # time.monotonic() when its load was last asked (policy.local.FRESH_S)
    pressed_at: float = 0.0  # time.monotonic() when it last named a release or shortening new to this router
    load_route: bool | None = None  # answers GET /v1/pdx/load (pdx_contract.load); False: no, read /metrics

    def note_releases(
        self,
        holds: list[str],
        seq: int,
        since: int | None = None,
        covered: list[str] | None = None,
        kept: dict[str, int] | None = None,
    ) -> None:
        """Holds this decode says it released early (its answer to a claim, or a note in a turn's
        answer naming those after `since`; `covered`: those a younger hold covers): their turns
        go plain at once, without a claim. The next claim asks for those after `seq` only when
        nothing between is missing. `kept`: holds it shortened, and the tokens it still keeps.
        A release or a shortening not heard of before, other than a superseded hold's, marks the
        decode pressed (`pressed_at`, `policy.holds.pressed`)."""
        covers = set(covered or ())
        kept = kept or {}
        if any(h not in covers and h not in self.released for h in holds) or any(
            self.kept.get(h) != t for h, t in kept.items()
        ):
            self.pressed_at = time.monotonic()
        for hold in holds:
            self.released[hold] = hold in covers
        while len(self.released) > KNOWN_RELEASES:
            del self.released[next(iter(self.released))]
        for hold, tokens in kept.items():
            self.kept.pop(hold, None)
            self.kept[hold] = tokens
        while len(self.kept) > KNOWN_RELEASES:
            del self.kept[next(iter(self.kept))]
        if since is None:
            self.released_seq = seq
        elif since <= self.released_seq:
            self.released_seq = max(seq, self.released_seq)
