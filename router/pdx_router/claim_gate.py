"""The wait before a claim (`router.claimQueueTokens`): per prefill, first come first served.

A claim pins its hold on decode until prefill has answered. Claimed on arrival, a turn queued
behind long prefills pins its hold for the whole wait; with many such turns decode can release
nothing when new work needs blocks, and that work waits (the H100 overcommit point: decode hops
of 1-2.6 s, every hold claimed, docs/results/h100-2026-12-05-wave). So a turn that would claim
waits here instead, its hold unclaimed and still releasable, until the prompt tokens its prefill
has yet to compute for this router's requests in flight are at most the budget
(`policy.holds.may_claim`; each request's tokens estimated by `policy.holds.prefill_tokens`).
In tokens, not requests: a queue of short prefills is short in time, and holds no claim for long.
A turn that claims nothing passes at once, unless turns wait: then it queues behind them, so
that fresh prefills cannot starve a waiting one. Whether a waiting turn still claims is asked
again each time the queue moves: a hold that decode released meanwhile (its note reached the
router) pins nothing any more, so its turn goes at its place in the queue instead of holding the
queue until prefill drains (on the H200's overcommit point, three such turns waited 2.0-2.7 s
at the gate and then found their holds gone). The count is this router's own: replicas each
keep theirs.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from .policy import holds


class Slot:
    """A turn's place on its prefill, from `ClaimGate.enter` until its prefill hop is over."""

    __slots__ = ("_gate", "_held", "_tokens", "_url")

    def __init__(self, gate: ClaimGate, url: str, tokens: int) -> None:
        self._gate = gate
        self._url = url
        self._tokens = tokens
        self._held = True

    def leave(self) -> None:
        """Idempotent: the first call frees the place, and the next waiting turn may go."""
        if self._held:
            self._held = False
            self._gate.leave(self._url, self._tokens)


Claims = bool | Callable[[], bool]  # whether the turn claims a hold, or how to ask it again


def _claims(claims: Claims) -> bool:
    return claims() if callable(claims) else claims


class ClaimGate:
    """Prompt tokens in flight and turns waiting, per prefill URL."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._in_flight: dict[str, int] = {}
        self._waiting: dict[str, deque[tuple[asyncio.Future[None], int, Claims]]] = {}

    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def in_flight(self, url: str) -> int:
        return self._in_flight.get(url, 0)

    async def enter(self, url: str, tokens: int, claims: Claims) -> Slot:
        """Until the turn may go to this prefill (`tokens`: what prefill will compute of it;
        `claims`: it claims a hold first, or a function that says whether it still does)."""
        queue = self._waiting.get(url)
        if not queue and (not _claims(claims) or holds.may_claim(self._in_flight.get(url, 0), self.budget)):
            self._in_flight[url] = self._in_flight.get(url, 0) + tokens
            return Slot(self, url, tokens)
        if queue is None:
            queue = self._waiting[url] = deque()
        admitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        item = (admitted, tokens, claims)
        queue.append(item)
        try:
            await admitted
        except asyncio.CancelledError:
            if admitted.done() and not admitted.cancelled():
                self.leave(url, tokens)  # admitted, then its client left before it ran
            else:
                queue.remove(item)
                self._admit(url)  # a turn behind it may go now
            raise
        return Slot(self, url, tokens)

    def leave(self, url: str, tokens: int) -> None:
        self._in_flight[url] = max(0, self._in_flight.get(url, 0) - tokens)
        self._admit(url)

    def _admit(self, url: str) -> None:
        queue = self._waiting.get(url)
        while queue:
            admitted, tokens, claims = queue[0]
            if _claims(claims) and not holds.may_claim(self._in_flight.get(url, 0), self.budget):
                return
            queue.popleft()
            self._in_flight[url] = self._in_flight.get(url, 0) + tokens
            admitted.set_result(None)
        if queue is not None:
            del self._waiting[url]
