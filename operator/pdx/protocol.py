"""Timing facts of vLLM's bidirectional KV transfer that the API's defaults and rules build on."""

from __future__ import annotations

# Prefill declines a D->P read within 5 s of decode's expiry; the router's own deadline for
# an entry must end before that.
PREFILL_DECLINE_WINDOW_SECONDS = 5
