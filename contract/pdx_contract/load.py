"""Decode's load as the router reads it before a long suffix goes local: ``GET /v1/pdx/load``.

The router asks a decode's load at every health check (decode-local's busy rule) and again,
at once, before a long suffix would go the D->P way only because of a scrape seconds old
(`pdx_router.policy.local.worth_a_fresh_look`): that second look is on the turn's path. vLLM's
``/metrics`` answers it, but renders every metric to do so: 62 kB and 7 ms on a CPU engine
(0.9 ms for ``/health``), in the API server's event loop that also streams every answer, and
12-14 ms on the H200 of ``docs/results/h200-2026-12-06h-wave`` (a fresh look's turn against the
others). This route answers the one number from the API server's own books.

Typed here once: the engine plugin serves it, the router reads it.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from .base import Document

PATH = "/v1/pdx/load"


class LoadAnswer(Document):
    """What decode writes for routers (unknown fields ignored, as `pdx_contract.holds`' answers)."""

    model_config = ConfigDict(extra="ignore")

    requests: int = Field(ge=0)
    """Requests this API server has in the engine and not finished: running, waiting (for KV
    blocks or a KV read too). vLLM's `vllm:num_requests_running` plus `_waiting`, live."""
