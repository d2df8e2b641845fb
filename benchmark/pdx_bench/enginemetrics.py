"""KV transfer totals from the engines' Prometheus `/metrics` (NIXL connector histograms).

NIXL records a transfer on the engine that initiates it: decode's pulls after prefill (P->D)
show on decode, prefill's reads of a finished turn (D->P, the bidirectional path) on prefill.
Histograms are cumulative, so a difference of two scrapes is what happened in between.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

XFER_TIME = "vllm:nixl_xfer_time_seconds"
XFER_BYTES = "vllm:nixl_bytes_transferred"


@dataclass(frozen=True)
class XferTotals:
    """Cumulative NIXL transfer time (s), count and bytes summed over engines and labels."""

    seconds: float = 0.0
    count: float = 0.0
    bytes: float = 0.0

    def __sub__(self, other: XferTotals) -> XferTotals:
        return XferTotals(self.seconds - other.seconds, self.count - other.count, self.bytes - other.bytes)

    def __add__(self, other: XferTotals) -> XferTotals:
        return XferTotals(self.seconds + other.seconds, self.count + other.count, self.bytes + other.bytes)


def parse_totals(text: str) -> XferTotals:
    """Sum the NIXL histograms' _sum and _count samples in one exposition text."""
    seconds = count = nbytes = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{XFER_TIME}_sum":
                seconds += sample.value
            elif sample.name == f"{XFER_TIME}_count":
                count += sample.value
            elif sample.name == f"{XFER_BYTES}_sum":
                nbytes += sample.value
    return XferTotals(seconds, count, nbytes)


class EngineScraper:
    """Scrapes every engine of each role; a role whose scrape fails reads as None."""

    def __init__(self, session: aiohttp.ClientSession, engine_urls: Mapping[str, Iterable[str]]) -> None:
        self._session = session
        self._urls = {role: [u.rstrip("/") for u in urls] for role, urls in engine_urls.items()}

    @property
    def enabled(self) -> bool:
        return any(self._urls.values())

    async def _one(self, url: str) -> XferTotals:
        timeout = aiohttp.ClientTimeout(total=10)
        async with self._session.get(f"{url}/metrics", timeout=timeout) as resp:
            resp.raise_for_status()
            return parse_totals(await resp.text())

    async def role(self, role: str) -> XferTotals | None:
        urls = self._urls.get(role, [])
        if not urls:
            return None
        try:
            parts = await asyncio.gather(*(self._one(u) for u in urls))
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        total = XferTotals()
        for p in parts:
            total = total + p
        return total
