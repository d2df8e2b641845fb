"""What a tenant's cache_salt costs the router per request (issue 44): `client_request` (the
policy step every request passes, where the salt is set) with cacheIsolation tenant and shared,
side by side in one run, best of REPEATS blocks each.

    .venv/bin/python scripts/bench_cache_salt.py
"""

from __future__ import annotations

import timeit

from pdx_contract.router_config import TenancyConfig
from pdx_router.policy.shapes import Front, client_request

CALLS, REPEATS = 20_000, 5
BODY = {
    "model": "m",
    "stream": True,
    "messages": [{"role": "system", "content": "x" * 4000}, {"role": "user", "content": "y" * 2000}],
}
HEADERS = {"Authorization": "Bearer key-a"}


def per_call_us(front: Front) -> float:
    call = lambda: client_request(BODY, HEADERS, "/v1/chat/completions", True, front)  # noqa: E731
    return min(timeit.repeat(call, number=CALLS, repeat=REPEATS)) / CALLS * 1e6


def main() -> None:
    shared = per_call_us(Front(TenancyConfig(identity="apiKey", cache_isolation="shared")))
    tenant = per_call_us(Front(TenancyConfig(identity="apiKey", cache_isolation="tenant")))
    extra = tenant - shared
    print(f"client_request: shared {shared:.2f} us, tenant {tenant:.2f} us, +{extra:.2f} us ({tenant / shared:.3f}x)")


if __name__ == "__main__":
    main()
