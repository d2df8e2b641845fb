"""The preStop of a decode pod: wait until no live conversation entry points at this decode,
then let Kubernetes stop vLLM.

While it waits the pod is terminating, so the operator publishes it as draining: the router
decodes nothing new here, and each conversation's next turn reads its KV from here and moves
to another decode. Without the wait, a scale-down would drop that KV and every conversation
pinned here would recompute its whole history. The wait ends when the router counts no entry
of its config generation here (a rollout's old generation has none that matter), when the
router cannot say, or after PDX_DRAIN_SECONDS (the router's entry deadline: no entry outlives
it), so termination always completes.

Standard library only: it runs in the serving image, where pdx's packages are not installed.
It reads the router's `GET /v1/pdx/holding` answer (pdx_contract.stats.Holding).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping

POLL_SECONDS = 2.0
TIMEOUT_SECONDS = 2.0


def decode_url(env: Mapping[str, str]) -> str:
    """This pod as the router's endpoints file names it (IPv6 literals in brackets)."""
    host = env["POD_IP"]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{env.get('PDX_HTTP_PORT', '8000')}"


def holding(router: str, me: str) -> int | None:
    """Live entries the router counts here; None when it cannot say."""
    url = f"{router}/v1/pdx/holding?{urllib.parse.urlencode({'decode': me})}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as resp:
            entries = json.loads(resp.read()).get("entries")
    except (OSError, ValueError):
        return None
    return entries if isinstance(entries, int) else None


def drain(
    router: str,
    me: str,
    bound: float,
    ask: Callable[[str, str], int | None] = holding,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Wait as the module says; returns why the wait ended (for the pod's log)."""
    deadline = clock() + bound
    while True:
        entries = ask(router, me)
        if entries is None:
            return "the router did not answer: not waiting"
        if entries == 0:
            return "no conversation's KV left here"
        if clock() >= deadline:
            return f"{entries} entries still here after {bound:g} s: their conversations recompute"
        sleep(POLL_SECONDS)


def main(env: Mapping[str, str] = os.environ) -> int:
    router, bound = env.get("PDX_DRAIN_ROUTER"), float(env.get("PDX_DRAIN_SECONDS", "0") or 0)
    if not router or bound <= 0 or "POD_IP" not in env:
        print("pdx drain: PDX_DRAIN_ROUTER, PDX_DRAIN_SECONDS or POD_IP unset: not waiting", file=sys.stderr)
        return 0
    print(f"pdx drain: {drain(router.rstrip('/'), decode_url(env), bound)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
