"""/metrics stays small whatever paths clients ask for, and a scrape never stalls streams."""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import Iterator

import aiohttp
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from tests.router.conftest import StackFactory
from tests.router.helpers import chat, user

ROUTES = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/ready", "/metrics", "/v1/pdx/stats"}
_REQUESTS = re.compile(rb'^pdx_router_requests_total\{route="([^"]*)",status="([^"]*)"\} (\S+)$', re.M)


async def _requests(http: aiohttp.ClientSession, url: str) -> dict[tuple[str, str], float]:
    async with http.get(url + "/metrics") as r:
        body = await r.read()
    return {(m[1].decode(), m[2].decode()): float(m[3]) for m in _REQUESTS.finditer(body)}


async def test_paths_no_route_matches_share_one_label(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack()
    assert (await chat(http, s.url, [user("hi")]))[0] == 200
    for _ in range(300):
        async with http.get(f"{s.url}/{secrets.token_hex(6)}") as r:
            assert r.status == 404
    async with http.post(s.url + "/health") as r:  # a known path, the wrong method
        assert r.status == 405
    counts = await _requests(http, s.url)
    assert {route for route, _ in counts} <= ROUTES | {"unmatched"}, counts
    assert counts[("unmatched", "404")] == 300 and counts[("unmatched", "405")] == 1
    assert counts[("/v1/chat/completions", "200")] == 1


def test_statuses_outside_the_known_few_are_counted_by_class() -> None:
    from pdx_router.metrics import status_label

    assert [status_label(s) for s in (200, 408, 429, 502)] == ["200", "408", "429", "502"]
    assert [status_label(s) for s in (201, 418, 451, 599, 99, 1000)] == ["2xx", "4xx", "4xx", "5xx", "other", "other"]


class _Slow(Collector):
    """A collector that takes 0.5 s of CPU-bound time, as 10 MB of series did."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        time.sleep(0.5)
        g = GaugeMetricFamily("pdx_test_slow", "slow to collect")
        g.samples.append(Sample("pdx_test_slow", {}, 1.0))
        yield g


async def test_a_scrape_does_not_stall_the_event_loop(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack()
    s.router.metrics.registry.register(_Slow())
    stall = 0.0
    done = False

    async def tick() -> None:
        nonlocal stall
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            stall, last = max(stall, now - last), now

    ticker = asyncio.create_task(tick())
    async with http.get(s.url + "/metrics") as r:
        assert r.status == 200 and b"pdx_test_slow 1.0" in await r.read()
    done = True
    await ticker
    assert stall < 0.25, f"the event loop stood still {stall:.2f} s during a scrape"
