"""Dropped claims wait for the next claim to their decode, or go alone after flush_seconds."""

from __future__ import annotations

import asyncio

from pdx_contract.holds import MAX_IDS
from pdx_router.claims import ClaimDrops

from .helpers import ep

AUTH = {"Authorization": "Bearer k"}


async def test_drops_ride_with_the_next_claim_with_the_same_headers_only() -> None:
    sent: list[tuple[str, list[str]]] = []

    async def send(decode: object, drops: list[str], headers: dict[str, str]) -> None:
        sent.append((str(headers), drops))

    drops = ClaimDrops(send, flush_seconds=60)
    d0, d1 = ep("decode", "http://d0"), ep("decode", "http://d1")
    drops.add(d0, "a", AUTH)
    drops.add(d0, "b", AUTH)
    drops.add(d0, "c", {})
    assert drops.take(d1, AUTH) == []
    assert drops.take(d0, AUTH) == ["a", "b"]
    assert drops.take(d0, AUTH) == []
    assert drops.pending() == 1 and sent == []


async def test_a_drop_with_no_claim_after_it_is_sent_alone_once() -> None:
    sent: list[tuple[dict[str, str], list[str]]] = []

    async def send(decode: object, drops: list[str], headers: dict[str, str]) -> None:
        sent.append((headers, drops))

    drops = ClaimDrops(send, flush_seconds=0.01)
    drops.add(ep("decode", "http://d0"), "a", AUTH)
    await asyncio.sleep(0.1)
    assert sent == [(AUTH, ["a"])] and drops.pending() == 0


async def test_a_claim_carries_at_most_the_contracts_limit_and_the_rest_is_flushed() -> None:
    sent: list[list[str]] = []

    async def send(decode: object, drops: list[str], headers: dict[str, str]) -> None:
        sent.append(drops)

    drops = ClaimDrops(send, flush_seconds=0.01)
    d0 = ep("decode", "http://d0")
    for i in range(MAX_IDS + 3):
        drops.add(d0, f"h{i}", {})
    assert len(drops.take(d0, {})) == MAX_IDS
    await asyncio.sleep(0.1)
    assert sent == [["h256", "h257", "h258"]]
