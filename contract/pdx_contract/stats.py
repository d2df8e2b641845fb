"""The router's `GET /v1/pdx/stats`: reuse counters and inter-turn gaps, read by the operator.

Unlike the documents the operator writes, unknown fields are ignored here: a newer router's
extra counters must not blind an older operator during an upgrade.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict

from .base import Document


class _Read(Document):
    model_config = ConfigDict(extra="ignore")


class ReuseCounts(_Read):
    """Turns per outcome (snake_case keys: they are the outcome names)."""

    model_config = ConfigDict(alias_generator=None)

    hit: int = 0
    miss: int = 0
    expired: int = 0
    declined: int = 0
    prefix_mismatch: int = 0
    below_threshold: int = 0
    local: int = 0
    """Turns prefilled on the decode that held their conversation (decodeLocalMaxTokens)."""
    released: int = 0
    """Turns whose held KV decode had released under memory pressure: plain P/D."""

    def with_entry(self) -> int:
        return sum(getattr(self, o) for o in WITH_ENTRY)

    def reused(self) -> int:
        """Turns that built on decode's KV: read back by prefill, or prefilled on that decode."""
        return self.hit + self.local


# The reuse outcomes of a conversation's turns, as counted (a turn of no conversation, by id
# or history, counts nowhere): the router's metrics and the operator's advice both key on these names.
REUSE_OUTCOMES: tuple[str, ...] = tuple(ReuseCounts.model_fields)
# Outcomes of a turn whose conversation had a stored entry (a `miss` had none).
WITH_ENTRY = tuple(o for o in REUSE_OUTCOMES if o != "miss")


class PromptIdSources(_Read):
    """Where reuse candidates' prompt ids came from: the router's tokenizer or /tokenize."""

    local: int = 0
    engine: int = 0


class FoundCounts(_Read):
    """Turns that found their conversation's entry, by how they named the conversation: the
    body's `conversation_id`, the X-Session-ID header, or the history of their messages."""

    id: int = 0
    header: int = 0
    history: int = 0


class GapSummary(_Read):
    count: int = 0
    p50: float = 0.0
    p95: float = 0.0
    max: float = 0.0


class HeldKvCounts(_Read):
    """Decodes' held KV as the router last polled it (`pdx_contract.holds`, at each health check),
    summed over the decodes that answered."""

    decodes: int = 0
    """Decodes that answered the holds route."""
    valve_off: int = 0
    """Of those, decodes that release no held KV under pressure: no route (an engine without
    pdx's plugin), a vLLM the plugin could not patch, or releaseUnderPressure false."""
    held_blocks: int = 0
    capacity_blocks: int = 0
    releases: int = 0
    """Holds released early under pressure, since each engine started."""
    trims: int = 0
    """Holds shortened early under pressure (tail freed, prefix kept), since each engine started."""
    waited: int = 0
    """Requests refused KV blocks while held KV was there, since each engine started."""
    claimed: int = 0
    """Holds a router's claim pins now."""
    lapsed: int = 0
    """Holds released after their claim's lease ran out (a drop that never came), since each
    engine started."""


class ClaimCounts(_Read):
    """This router's claims on decodes' held KV before a read, by decode's answer (snake_case keys:
    they are `pdx_router_held_kv_claims`' labels), since the router started."""

    model_config = ConfigDict(alias_generator=None)

    held: int = 0
    """Pinned: the turn read the hold."""
    gone: int = 0
    """Released under pressure (or read, or expired): the turn went `released`."""
    no_valve: int = 0
    failed: int = 0
    unreachable: int = 0


class RouterStats(_Read):
    reuse: ReuseCounts = ReuseCounts()
    reused_tokens: int = 0
    tokenize_mismatch: int = 0
    prompt_ids: PromptIdSources = PromptIdSources()
    found_by: FoundCounts = FoundCounts()
    entries: int = 0
    store_bytes: int = 0
    """The entries' bytes as the store bounds them (`store.maxBytes`); with the entries' ids,
    bytes per stored token (scripts/bench_store_memory.py)."""
    inter_turn_gap_seconds: GapSummary = GapSummary()
    router_tokenizer: Literal["off", "probation", "trusted", "disabled"] = "off"
    """The router's own tokenizer: not configured, on probation, trusted, or disabled after a mismatch."""
    held_kv: HeldKvCounts = HeldKvCounts()
    claims: ClaimCounts = ClaimCounts()


class Holding(_Read):
    """The router's `GET /v1/pdx/holding?decode=URL`, read by a decode being scaled away (its
    preStop, `pdx_engine.drain`, which reads `entries` with the standard library alone: it runs
    in the serving image, where pdx's packages are not installed)."""

    decode: str
    generation: str
    entries: int | None
    """Live entries of this generation whose KV that decode holds; None: the store did not answer."""
