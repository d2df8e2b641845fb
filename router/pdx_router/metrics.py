"""Prometheus metrics and the JSON summary the operator reads from /v1/pdx/stats."""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Final, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pdx_contract.stats import (
    REUSE_OUTCOMES,
    ClaimCounts,
    FoundCounts,
    GapSummary,
    HeldKvCounts,
    PromptIdSources,
    ReuseCounts,
    RouterStats,
)

from . import NATIVE
from .endpoints import Endpoint
from .policy import FoundBy, Outcome, local
from .policy.holds import Claim

_LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_GAP_BUCKETS: Final = (1, 5, 10, 30, 60, 120, 240, 300, 450, 480, 600, 1200, 3600)
# The statuses counted by their own number: the router's own, and the engine 4xx a client is
# likeliest to see passed on. Any other is counted by its class (4xx, 5xx): a label's values
# stay few whatever engines or clients do.
_STATUSES: Final = frozenset({200, 400, 401, 403, 404, 405, 408, 413, 422, 429, 500, 502, 503, 504})
CLOSE_REASONS: Final = ("max_connections", "header_timeout")
UNMATCHED: Final = "unmatched"  # the route label of every request no route matched (404, 405)


class DecodesHeldKv(Collector):
    """Each decode's held KV as the router last polled it (`discovery`, every health check):
    read at scrape time from the pool, so a decode that left leaves no stale series."""

    def __init__(self, endpoints: Callable[[], Sequence[Endpoint]]) -> None:
        self.endpoints = endpoints

    def collect(self) -> Iterator[Metric]:
        blocks = GaugeMetricFamily(
            "pdx_router_decode_held_kv_blocks",
            "KV blocks decode keeps for finished turns' next turns.",
            labels=["decode"],
        )
        capacity = GaugeMetricFamily(
            "pdx_router_decode_kv_capacity_blocks", "KV blocks decode has in all.", labels=["decode"]
        )
        valve = GaugeMetricFamily(
            "pdx_router_decode_held_kv_valve",
            "1: decode releases held KV under memory pressure (pdx's valve); 0: it holds until a read or the TTL.",
            labels=["decode"],
        )
        releases = CounterMetricFamily(
            "pdx_router_decode_held_kv_releases",
            "Holds decode released early under memory pressure, since the engine started.",
            labels=["decode"],
        )
        trims = CounterMetricFamily(
            "pdx_router_decode_held_kv_trims",
            "Holds decode shortened early under memory pressure (tail freed, prefix still readable),"
            " since the engine started.",
            labels=["decode"],
        )
        waited = CounterMetricFamily(
            "pdx_router_decode_held_kv_waited",
            "Requests decode refused KV blocks while it kept held KV, since the engine started: held"
            " KV made new work wait (the valve off, or every hold claimed).",
            labels=["decode"],
        )
        claimed = GaugeMetricFamily(
            "pdx_router_decode_held_kv_claimed",
            "Holds a router's claim pins now: a read is on its way (pdx_contract.holds).",
            labels=["decode"],
        )
        lapsed = CounterMetricFamily(
            "pdx_router_decode_held_kv_lapsed",
            "Holds decode released after their claim's lease ran out, since the engine started: claims"
            " whose drop never came (a router restarted mid-turn, a lost call).",
            labels=["decode"],
        )
        for ep in self.endpoints():
            answer = ep.held_kv
            if ep.role != "decode" or answer is None:
                continue
            name = [decode_label(ep)]
            blocks.add_metric(name, answer.held_blocks)
            capacity.add_metric(name, answer.capacity_blocks)
            valve.add_metric(name, 1 if answer.valve else 0)
            releases.add_metric(name, answer.releases)
            trims.add_metric(name, answer.trims)
            waited.add_metric(name, answer.waited)
            claimed.add_metric(name, answer.claimed)
            lapsed.add_metric(name, answer.lapsed)
        yield from (blocks, capacity, valve, releases, trims, waited, claimed, lapsed)


def decode_label(ep: Endpoint) -> str:
    """A decode's metric label: its pod name, else a digest of its URL. /metrics is served on the
    clients' port, and no client may learn an engine's address."""
    return ep.name or "decode-" + hashlib.sha256(ep.url.encode()).hexdigest()[:12]


def held_kv_counts(endpoints: Sequence[Endpoint]) -> HeldKvCounts:
    """The decodes' last holds answers, summed (a decode without the route counts as valve off)."""
    decodes = [ep for ep in endpoints if ep.role == "decode" and (ep.held_kv is not None or ep.claims is False)]
    answers = [ep.held_kv for ep in decodes if ep.held_kv is not None]
    return HeldKvCounts(
        decodes=len(decodes),
        valve_off=sum(1 for ep in decodes if ep.held_kv is None or not ep.held_kv.valve),
        held_blocks=sum(a.held_blocks for a in answers),
        capacity_blocks=sum(a.capacity_blocks for a in answers),
        releases=sum(a.releases for a in answers),
        trims=sum(a.trims for a in answers),
        waited=sum(a.waited for a in answers),
        claimed=sum(a.claimed for a in answers),
        lapsed=sum(a.lapsed for a in answers),
    )


class Metrics:
    """One registry per router instance, so tests can run several side by side."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(
            "pdx_router_ttft_seconds",
            "Time to first token seen by the client.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prefill = Histogram(
            "pdx_router_prefill_seconds",
            "Duration of the prefill hop.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.claim_wait = Histogram(
            "pdx_router_claim_wait_seconds",
            "Time a turn that reads held KV waited in the router, its hold unclaimed, for its"
            " prefill to have at most router.claimQueueTokens prompt tokens in flight.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.reuse = Counter(
            "pdx_router_reuse",
            "Reuse outcome per turn of a conversation.",
            ["outcome"],
            registry=r,
        )
        self.reused_tokens = Counter(
            "pdx_router_reused_tokens",
            "Tokens prefill was allowed to read from decode.",
            registry=r,
        )
        self.entries = Gauge("pdx_router_entries", "Conversation entries held by the store.", registry=r)
        self.gap = Histogram(
            "pdx_router_inter_turn_gap_seconds",
            "Time between the end of a turn and the next turn of the same conversation.",
            buckets=_GAP_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "pdx_router_requests",
            "Requests by route and status.",
            ["route", "status"],
            registry=r,
        )
        self.tokenize_mismatch = Counter(
            "pdx_router_tokenize_mismatch",
            "Reused turns whose /tokenize ids differ from the ids decode used (entry dropped).",
            registry=r,
        )
        self.prompt_ids = Counter(
            "pdx_router_prompt_ids",
            "Where a reuse candidate's prompt ids came from: the router's tokenizer or /tokenize.",
            ["source"],
            registry=r,
        )
        self.found_by = Counter(
            "pdx_router_conversations_found",
            "Turns that found their conversation's entry, by how: conversation_id (id), X-Session-ID"
            " (header), or the history of their messages (history).",
            ["by"],
            registry=r,
        )
        self.local_skip = Counter(
            "pdx_router_decode_local_skipped",
            "Turns that could read decode's KV but went through prefill instead of decode-local, by"
            " why: unknown (new tokens cannot be told), long (above decodeLocalMaxTokens), busy"
            " (decodeLocalMaxBusy requests in flight), holder (its decode serves no new turns), released"
            " (its decode said it released the hold under pressure).",
            ["why"],
            registry=r,
        )
        self.claims = Counter(
            "pdx_router_held_kv_claims",
            "Claims on decode's held KV before a read, by answer: held (pinned, read), gone (released"
            " under memory pressure: the turn is `released`), no_valve (the engine never releases"
            " early), failed (an answer other than the route's: not read), unreachable (no answer:"
            " the turn goes to another decode).",
            ["answer"],
            registry=r,
        )
        self.upstream_errors = Counter("pdx_router_upstream_errors", "Engine errors by role.", ["role"], registry=r)
        self.store_errors = Counter(
            "pdx_router_store_errors",
            "Entry store calls that failed (the turn went on as plain P/D, or was not kept).",
            ["op"],
            registry=r,
        )
        self.connections_closed = Counter(
            "pdx_router_connections_closed",
            "Client connections the router ended: refused above maxConnections, or closed at"
            " headerTimeoutSeconds without a whole request.",
            ["reason"],
            registry=r,
        )
        self.open_connections = Gauge("pdx_router_open_connections", "Client connections open.", registry=r)
        # A fleet whose routers fell back to the pure-Python data path (a stale or missing
        # build: native.py) spends a few percent more CPU per request; this says which runs.
        build = Gauge(
            "pdx_router_build_info",
            "The router's build: data_path is compiled or pure (see the start-up log for why).",
            ["data_path"],
            registry=r,
        )
        build.labels("compiled" if NATIVE == "compiled" else "pure").set(1)
        for o in REUSE_OUTCOMES:
            self.reuse.labels(o)
        for reason in CLOSE_REASONS:
            self.connections_closed.labels(reason)
        self._local_skip = {w: self.local_skip.labels(w.value) for w in local.SKIPPED}
        self._claims = {c: self.claims.labels(c.value) for c in Claim}
        self._claim_counts = dict.fromkeys((c.value for c in Claim), 0)
        self._found = {b.value: 0 for b in FoundBy if b is not FoundBy.NONE}
        for by in self._found:
            self.found_by.labels(by)
        self._requests: dict[tuple[str, int], Counter] = {}  # (route, status) -> its child (a bounded set)
        self._counts = dict.fromkeys(REUSE_OUTCOMES, 0)
        self._tokenize_mismatches = 0
        self._prompt_ids = {"local": 0, "engine": 0}
        self._reused = 0
        self._gaps: deque[float] = deque(maxlen=10_000)
        self._gap_count = 0
        self._gap_max = 0.0

    def outcome(self, outcome: Outcome, tokens: int = 0) -> None:
        if outcome is Outcome.NONE:
            return
        self._counts[outcome.value] += 1
        self.reuse.labels(outcome.value).inc()
        if tokens:
            self._reused += tokens
            self.reused_tokens.inc(tokens)

    def claim(self, answer: Claim) -> None:
        """Decode's answer to a claim on the held KV a turn was about to read."""
        self._claims[answer].inc()
        self._claim_counts[answer.value] += 1

    def local_skipped(self, why: local.Why) -> None:
        """A turn that could have been prefilled on its decode was not (OFF, NOT_HELD: uncounted)."""
        child = self._local_skip.get(why)
        if child is not None:
            child.inc()

    def found(self, by: FoundBy) -> None:
        """A turn found its conversation's entry (counted for all tenants together)."""
        if by is not FoundBy.NONE:
            self._found[by.value] += 1
            self.found_by.labels(by.value).inc()

    def request(self, route: str | None, status: int) -> None:
        """One answered request; route is the matched route's path, None if none matched."""
        key = (route or UNMATCHED, status)
        child = self._requests.get(key)
        if child is None:  # labels() validates and locks each time: looked up once per pair
            child = self._requests[key] = self.requests.labels(key[0], status_label(status))
        child.inc()

    def prompt_ids_from(self, source: str) -> None:
        """A reuse candidate's prompt ids came from `local` (the router's tokenizer) or `engine`."""
        self._prompt_ids[source] += 1
        self.prompt_ids.labels(source).inc()

    def tokenize_mismatched(self) -> None:
        self._tokenize_mismatches += 1
        self.tokenize_mismatch.inc()

    def inter_turn_gap(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.gap.observe(seconds)
        self._gaps.append(seconds)
        self._gap_count += 1
        self._gap_max = max(self._gap_max, seconds)

    def watch_decodes(self, endpoints: Callable[[], Sequence[Endpoint]]) -> None:
        """Export each decode's held KV figures (`DecodesHeldKv`) from this pool."""
        self.registry.register(DecodesHeldKv(endpoints))

    def stats(
        self,
        entries: int,
        router_tokenizer: Literal["off", "probation", "trusted", "disabled"],
        held_kv: HeldKvCounts | None = None,
    ) -> RouterStats:
        gaps = sorted(self._gaps)
        return RouterStats(
            reuse=ReuseCounts(**self._counts),
            reused_tokens=self._reused,
            tokenize_mismatch=self._tokenize_mismatches,
            prompt_ids=PromptIdSources(**self._prompt_ids),
            found_by=FoundCounts(**self._found),
            entries=entries,
            inter_turn_gap_seconds=GapSummary(
                count=self._gap_count, p50=_quantile(gaps, 0.5), p95=_quantile(gaps, 0.95), max=self._gap_max
            ),
            router_tokenizer=router_tokenizer,
            held_kv=held_kv if held_kv is not None else HeldKvCounts(),
            claims=ClaimCounts(**self._claim_counts),
        )


def status_label(status: int) -> str:
    if status in _STATUSES:
        return str(status)
    return f"{status // 100}xx" if 100 <= status < 600 else "other"


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    idx = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[idx]
