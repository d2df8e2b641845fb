"""The reuse facts the router answers a trusted client with (``router.reuseHeaders``).

The router writes them and ``pdx bench`` reads them, so their names live here, once.
"""

from __future__ import annotations

PREFILL_MS = "X-PDX-Prefill-Ms"  # the prefill hop, the D->P read included
ROUTER_MS = "X-PDX-Router-Ms"  # the router's own time before its first hop (plan, claim gate, claim)
REUSE = "X-PDX-Reuse"  # the turn's outcome: hit, local, miss, released, ...
REUSED_TOKENS = "X-PDX-Reused-Tokens"  # tokens the engine did not compute
FOUND_BY = "X-PDX-Found-By"  # how the turn named its conversation
