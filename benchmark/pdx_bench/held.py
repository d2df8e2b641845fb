"""Held KV under pressure, per point: how far the conversations overcommit decode's KV cache, and
what decode did about it (holds released and shortened, requests that waited behind held KV).

Decode's figures come from its own `POST /v1/pdx/holds` (pdx_contract.holds, an empty claim),
read before and after each point; the overcommit factor from the point's own records and
decode's KV capacity (vllm:cache_config_info)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from pydantic import ValidationError

from pdx_contract import holds as contract
from pdx_contract.stats import RouterStats

from .records import RequestRecord


@dataclass(frozen=True)
class HeldFigures:
    """Decode's held-KV counters, summed over the decodes (or their change over a point)."""

    releases: int
    waited: int
    trims: int = 0
    lapsed: int = 0  # released with a claim whose lease ran out: a drop that never came

    def since(self, before: HeldFigures) -> HeldFigures:
        return HeldFigures(
            self.releases - before.releases,
            self.waited - before.waited,
            self.trims - before.trims,
            self.lapsed - before.lapsed,
        )


async def read_holds(
    session: aiohttp.ClientSession, decode_urls: Sequence[str], release_unclaimed: bool = False
) -> HeldFigures | None:
    """The decodes' counters now; None when one has no holds route (no pdx plugin) or no answer.
    `release_unclaimed`: first have each decode let go of every hold nobody claims, so that a
    point starts from what it does itself, not from the holds of the point (or part) before."""
    releases = waited = trims = lapsed = 0
    for url in decode_urls:
        try:
            async with session.post(
                url.rstrip("/") + contract.PATH,
                json=contract.HoldsRequest(release_unclaimed=release_unclaimed).to_json(),
                timeout=aiohttp.ClientTimeout(total=30),
            ) as resp:
                if resp.status != 200:
                    return None
                answer = contract.HoldsAnswer.model_validate(await resp.json())
        except (aiohttp.ClientError, TimeoutError, ValidationError):
            return None
        releases += answer.releases
        waited += answer.waited
        trims += answer.trims
        lapsed += answer.lapsed
    return HeldFigures(releases, waited, trims, lapsed) if decode_urls else None


def held_demand(records: Sequence[RequestRecord], shared_tokens: int = 0) -> int:
    """Tokens decode would keep if it held every conversation's last turn: per conversation its
    longest turn's prompt plus answer, with a prefix all conversations share (`shared_tokens`,
    one system prompt) counted once, as vLLM's prefix cache keeps it once."""
    longest: dict[str, int] = {}
    for r in records:
        tokens = r.input_num_tokens + r.output_num_tokens
        longest[r.conversation_id] = max(longest.get(r.conversation_id, 0), tokens)
    shared = min([shared_tokens, *longest.values()]) if longest else 0
    return sum(longest.values()) - shared * max(0, len(longest) - 1)


def overcommit(
    records: Sequence[RequestRecord], decode_capacity: Sequence[int | None], shared_tokens: int = 0
) -> float | None:
    """Held demand over what the decodes can keep; None when a decode's capacity is unknown."""
    if not decode_capacity or any(c is None or c <= 0 for c in decode_capacity):
        return None
    return held_demand(records, shared_tokens) / sum(c for c in decode_capacity if c is not None)


def claims_line(router_stats: dict[str, Any] | None) -> str | None:
    """The router's claims on held KV over a leg, by decode's answer (`RouterStats.claims`), as
    one line for the report; None when the router made none or did not say (an older router)."""
    if not router_stats:
        return None
    claims = RouterStats.model_validate(router_stats).claims
    counts = claims.model_dump()
    if not any(counts.values()):
        return None
    return ", ".join(f"{answer} {n}" for answer, n in counts.items())
