"""Engine-side figures from the engines' Prometheus `/metrics`: vLLM's request histograms and NIXL's.

Every figure pdx reads is a histogram, and histograms are cumulative: the difference of two
scrapes is what happened in between. One snapshot holds, per role, each histogram's `_sum`
and `_count` summed over that role's engines and label sets. A histogram an engine does not
export is absent from the snapshot (never 0), and so is a difference that went negative (the
engine restarted between the scrapes).

NIXL records a transfer on the engine that initiates it: decode's pulls after prefill (P->D)
show on decode, prefill's reads of a finished turn (D->P, the bidirectional path) on prefill.

The names, identical in vLLM 0.26.0 and 0.32.0:
- `vllm:time_to_first_token_seconds`: from the request's arrival in the engine (after the API
  server rendered and tokenized it) to its first token;
- `vllm:request_queue_time_seconds`: waiting before first scheduled;
- `vllm:request_prefill_time_seconds`: first scheduled to first token;
- `vllm:nixl_xfer_time_seconds`, `vllm:nixl_post_time_seconds`, `vllm:nixl_bytes_transferred`,
  `vllm:nixl_num_descriptors`: one observation per NIXL transfer the engine initiated (duration,
  time to post it, bytes, and the copies NIXL made of it once it merged adjacent blocks).

Two more, vLLM 0.32.0 (`vllm/v1/metrics/loggers.py`, `stats.py`):
- `vllm:prompt_tokens_by_source`, a counter by `source`: each prompt token the engine
  prefilled, by where its KV came from: `local_cache_hit` (its own prefix cache),
  `external_kv_transfer` (the KV connector: on prefill, the D->P read of decode's blocks),
  `local_compute` (computed). A snapshot holds each source as a "histogram" of `sum` alone
  (`SOURCE_PREFIX` + source, count 0), so differences and sums work as for the others.
- `vllm:cache_config_info`, a gauge whose labels are the cache config: `num_gpu_blocks` x
  `block_size` is the engine's KV capacity in tokens (`kv_capacity`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

TTFT = "vllm:time_to_first_token_seconds"
QUEUE_TIME = "vllm:request_queue_time_seconds"
PREFILL_TIME = "vllm:request_prefill_time_seconds"
XFER_TIME = "vllm:nixl_xfer_time_seconds"
POST_TIME = "vllm:nixl_post_time_seconds"
XFER_BYTES = "vllm:nixl_bytes_transferred"
COPIES = "vllm:nixl_num_descriptors"
HISTOGRAMS: tuple[str, ...] = (TTFT, QUEUE_TIME, PREFILL_TIME, XFER_TIME, POST_TIME, XFER_BYTES, COPIES)
PROMPT_BY_SOURCE = "vllm:prompt_tokens_by_source"
CACHE_CONFIG = "vllm:cache_config_info"
SOURCE_PREFIX = f"{PROMPT_BY_SOURCE}:"
LOCAL_HIT, EXTERNAL, COMPUTE = "local_cache_hit", "external_kv_transfer", "local_compute"
SOURCES: tuple[str, ...] = (LOCAL_HIT, EXTERNAL, COMPUTE)


@dataclass(frozen=True)
class Hist:
    """A histogram's cumulative `_sum` and `_count`."""

    sum: float = 0.0
    count: float = 0.0

    def __add__(self, other: Hist) -> Hist:
        return Hist(self.sum + other.sum, self.count + other.count)

    def __sub__(self, other: Hist) -> Hist:
        return Hist(self.sum - other.sum, self.count - other.count)


# metric name -> totals; a histogram the engines do not export is absent
Histograms = dict[str, Hist]
# role -> that role's histograms over its engines; None: a role not scraped, or a scrape that failed
Snapshot = dict[str, Histograms | None]


def parse_histograms(text: str, names: Iterable[str] = HISTOGRAMS) -> Histograms:
    """The named histograms' `_sum` and `_count` in one exposition text, summed over label sets."""
    wanted = {f"{n}{suffix}": (n, suffix) for n in names for suffix in ("_sum", "_count")}
    # Only the sample lines that matter go to the parser: an engine's /metrics is long.
    keep = tuple(wanted)
    lines = [line for line in text.splitlines() if line.startswith(keep)]
    out: Histograms = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            hit = wanted.get(sample.name)
            if hit is None:
                continue
            name, suffix = hit
            part = Hist(sum=sample.value) if suffix == "_sum" else Hist(count=sample.value)
            out[name] = out.get(name, Hist()) + part
    return out


def parse_sources(text: str) -> Histograms:
    """`vllm:prompt_tokens_by_source` per source (summed over engines), as sums under
    `SOURCE_PREFIX` + source; none when the engine does not export it."""
    lines = [line for line in text.splitlines() if line.startswith(PROMPT_BY_SOURCE)]
    out: Histograms = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            source = sample.labels.get("source")
            if sample.name == f"{PROMPT_BY_SOURCE}_total" and source in SOURCES:
                name = SOURCE_PREFIX + source
                out[name] = out.get(name, Hist()) + Hist(sum=sample.value)
    return out


def kv_capacity(text: str) -> int | None:
    """The engine's KV cache in tokens (num_gpu_blocks x block_size of `vllm:cache_config_info`),
    summed over its engines; None when it does not say."""
    lines = [line for line in text.splitlines() if line.startswith(CACHE_CONFIG)]
    total = 0
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            blocks, size = sample.labels.get("num_gpu_blocks"), sample.labels.get("block_size")
            if blocks and size and blocks.isdigit() and size.isdigit():
                total += int(blocks) * int(size)
    return total or None


def sources(hists: Histograms) -> dict[str, float] | None:
    """Prompt tokens by source (`SOURCES`) from one window's figures; None if not exported."""
    got = {s: hists[SOURCE_PREFIX + s].sum for s in SOURCES if SOURCE_PREFIX + s in hists}
    return got if len(got) == len(SOURCES) else None


def merge(parts: Iterable[Histograms]) -> Histograms:
    """Several engines' histograms as one role's: a histogram counts if any engine exports it."""
    out: Histograms = {}
    for part in parts:
        for name, hist in part.items():
            out[name] = out.get(name, Hist()) + hist
    return out


def delta(after: Histograms, before: Histograms) -> Histograms:
    """What happened between two scrapes. A histogram absent after stays absent; one that only
    appeared after started from 0; one that went down (a restart) is unknown, so absent."""
    out: Histograms = {}
    for name, hist in after.items():
        d = hist - before.get(name, Hist())
        if d.count >= 0 and d.sum >= 0:
            out[name] = d
    return out


def snapshot_delta(after: Snapshot, before: Snapshot) -> Snapshot:
    """Per role; a role missing from either scrape is None."""
    out: Snapshot = {}
    for role in sorted(set(after) | set(before)):
        a, b = after.get(role), before.get(role)
        out[role] = delta(a, b) if a is not None and b is not None else None
    return out


def accumulate(total: Snapshot | None, step: Snapshot) -> Snapshot:
    """Add one window's differences to a running total. A role unknown in any window is unknown,
    and so is a histogram absent from any window: a sum with a hole in it is no sum."""
    if total is None:
        return dict(step)
    out: Snapshot = {}
    for role in sorted(set(total) | set(step)):
        a, b = total.get(role), step.get(role)
        if a is None or b is None:
            out[role] = None
        else:
            out[role] = {name: a[name] + b[name] for name in a.keys() & b.keys()}
    return out


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


def xfer_totals(hists: Histograms) -> XferTotals:
    """The NIXL transfer figures of records (`kv_transfer_ms`): no histogram, no transfer."""
    t, b = hists.get(XFER_TIME, Hist()), hists.get(XFER_BYTES, Hist())
    return XferTotals(t.sum, t.count, b.sum)


def parse_totals(text: str) -> XferTotals:
    """Sum the NIXL histograms' _sum and _count samples in one exposition text."""
    return xfer_totals(parse_histograms(text, (XFER_TIME, XFER_BYTES)))


@dataclass
class GroupEngines:
    """What the engines counted during one (leg, prefix length) group, per role.

    `all_turns` is the difference of scrapes around the whole group. `followups`, with one
    client, sums the differences around each follow-up turn (turn >= 2) alone, so the first
    turn's full prefill stays out, as it does from the TTFT table; None otherwise.
    """

    all_turns: Snapshot
    followups: Snapshot | None = None
    # With one client: the follow-up windows summed per path, "prefill" (through prefill, a D->P
    # read or a recompute) and "local" (prefilled on decode), so a row of one path reads only its own.
    followups_by_path: dict[str, Snapshot] | None = None
    # With one client: the windows around first turns (turn 1) summed, for firstturn.py.
    first_turns: Snapshot | None = None


class EngineScraper:
    """Scrapes every engine of each role; a role whose scrape fails reads as None.

    An engine that could not be reached is not asked again by this scraper (one leg): a pod
    address that does not route would otherwise cost a timeout around every request.
    """

    def __init__(
        self, session: aiohttp.ClientSession, engine_urls: Mapping[str, Iterable[str]], timeout_s: float = 10.0
    ) -> None:
        self._session = session
        self._urls = {role: [u.rstrip("/") for u in urls] for role, urls in engine_urls.items()}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(3.0, timeout_s))
        self.unreachable: dict[str, str] = {}  # url -> why

    @property
    def enabled(self) -> bool:
        return any(self._urls.values())

    async def _one(self, url: str) -> Histograms:
        text = await self._text(url)
        return {**parse_histograms(text), **parse_sources(text)}

    async def _text(self, url: str) -> str:
        async with self._session.get(f"{url}/metrics", timeout=self._timeout) as resp:
            resp.raise_for_status()
            return await resp.text()

    async def capacity(self, role: str) -> list[int | None]:
        """Each engine's KV capacity in tokens (None: it did not say, or did not answer)."""
        out: list[int | None] = []
        for url in self._urls.get(role, []):
            try:
                out.append(kv_capacity(await self._text(url)))
            except (aiohttp.ClientError, TimeoutError, ValueError):
                out.append(None)
        return out

    async def histograms(self, role: str) -> Histograms | None:
        urls = self._urls.get(role, [])
        if not urls or any(u in self.unreachable for u in urls):
            return None
        results = await asyncio.gather(*(self._one(u) for u in urls), return_exceptions=True)
        parts: list[Histograms] = []
        for url, res in zip(urls, results, strict=True):
            if isinstance(res, aiohttp.ClientConnectionError | TimeoutError):
                self.unreachable[url] = repr(res)
            elif isinstance(res, aiohttp.ClientError | ValueError):
                pass  # answered, but not with metrics this time
            elif isinstance(res, BaseException):
                raise res
            else:
                parts.append(res)
        return merge(parts) if len(parts) == len(urls) else None

    async def snapshot(self) -> Snapshot:
        """Every role at once."""
        roles = sorted(r for r, urls in self._urls.items() if urls)
        parts = await asyncio.gather(*(self.histograms(r) for r in roles))
        return dict(zip(roles, parts, strict=True))

    async def role(self, role: str) -> XferTotals | None:
        hists = await self.histograms(role)
        return None if hists is None else xfer_totals(hists)
