"""Endpoint sources, generation pairing over HTTP, IPv6 literals, readiness."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import aiohttp
import pytest

from pdx_contract.base import engine_url
from pdx_contract.endpoints import PublishedEndpoint, Role
from pdx_router.discovery import FAILURE_THRESHOLD, Pool, read_endpoints_file, resolve

from .conftest import StackFactory
from .helpers import LONG, chat, user


def _ep(role: Role, url: str, generation: str, name: str = "") -> PublishedEndpoint:
    return PublishedEndpoint(role=role, url=url, generation=generation, name=name)


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback in this sandbox")
async def test_ipv6_engine_urls_work_end_to_end(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack(host="::1")
    assert s.prefill_urls[0].startswith("http://[::1]:")
    status, headers, _ = await chat(http, s.url, [user(LONG)])
    assert status == 200 and headers["X-PDX-Reuse"] == "miss"


def test_ipv6_addresses_get_brackets() -> None:
    assert engine_url("fd00::5", 8000) == "http://[fd00::5]:8000"
    assert engine_url("10.0.0.5", 8000) == "http://10.0.0.5:8000"


async def test_dns_resolution_gives_base_urls() -> None:
    urls = await resolve("localhost", 8000)
    assert set(urls) <= {"http://127.0.0.1:8000", "http://[::1]:8000"} and urls


async def test_rollout_pairs_only_engines_of_one_generation(
    make_stack: StackFactory, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    old = await make_stack(generation="unused")
    new = await make_stack(cluster=old.cluster, generation="unused")
    path = tmp_path / "endpoints.json"
    eps = [
        {"role": "prefill", "url": old.prefill_urls[0], "generation": "old", "name": "p-old"},
        {"role": "decode", "url": old.decode_urls[0], "generation": "old", "name": "d-old"},
        {"role": "prefill", "url": new.prefill_urls[0], "generation": "new", "name": "p-new"},
    ]
    path.write_text(json.dumps({"endpoints": eps}))
    s = await make_stack(
        cluster=old.cluster,
        n_prefill=0,
        n_decode=0,
        generation="new",
        prefill=(),
        decode=(),
        endpoints_file=str(path),
    )
    # "new" has no decode yet: serve from "old", never new prefill + old decode
    status, _, _ = await chat(http, s.url, [user(LONG)], conversation=None)
    assert status == 200
    assert len(old.prefill.requests) == 1 and new.prefill.requests == []
    ready = await http.get(s.url + "/ready")
    assert ready.status == 200 and (await ready.json())["generation"] == "old"


async def test_ready_is_503_without_a_healthy_pair(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack()
    s.decode.healthy = False
    await s.router.discovery.check_all()
    # One failed probe is a busy engine, not a dead one (like a readiness failureThreshold).
    assert (await http.get(s.url + "/ready")).status == 200
    for _ in range(FAILURE_THRESHOLD - 1):
        await s.router.discovery.check_all()
    assert (await http.get(s.url + "/ready")).status == 503
    status, _, _ = await chat(http, s.url, [user(LONG)])
    assert status == 503
    s.decode.healthy = True
    await s.router.discovery.check_all()
    assert (await http.get(s.url + "/ready")).status == 200


async def test_decode_block_size_is_learned_from_metrics(make_stack: StackFactory) -> None:
    s = await make_stack()
    decode = next(e for e in s.router.pool.endpoints if e.role == "decode")
    assert decode.block_size == s.cluster.block_size


def test_endpoints_file_parsing(tmp_path: Path) -> None:
    path = tmp_path / "e.json"
    path.write_text(json.dumps({"endpoints": [{"role": "decode", "url": "http://[fd00::1]:8000", "name": "d"}]}))
    assert read_endpoints_file(str(path), "g0") == [_ep("decode", "http://[fd00::1]:8000", "g0", "d")]
    path.write_text(json.dumps({"endpoints": [{"role": "router", "url": "http://x:1"}]}))
    with pytest.raises(ValueError, match=r"endpoints\[0\]\.role"):
        read_endpoints_file(str(path), "g0")


def test_pool_keeps_endpoint_state_across_refreshes() -> None:
    pool = Pool()
    pool.update("dns", [_ep("decode", "http://a:1", "g")])
    pool.endpoints[0].outstanding = 3
    new = pool.update("dns", [_ep("decode", "http://a:1", "g"), _ep("decode", "http://b:1", "g")])
    assert [e.url for e in new] == ["http://b:1"]
    assert pool.endpoints[0].outstanding == 3
    pool.update("dns", [])
    assert pool.endpoints == []


async def test_an_endpoints_file_with_engines_overrides_dns_so_generations_stay_true(tmp_path: Path) -> None:
    """DNS cannot tell an old-generation pod from a new one; the operator's file can."""
    from pdx_router.config import parse_config
    from pdx_router.discovery import Discovery
    from pdx_router.upstream import Upstream

    file = tmp_path / "endpoints.json"
    file.write_text(json.dumps({"endpoints": []}))
    cfg = parse_config(
        {
            "generation": "new",
            "endpointsFile": str(file),
            "dns": {"prefill": "localhost", "decode": "localhost", "port": 9, "refreshSeconds": 60},
        }
    )
    pool, upstream = Pool(), Upstream(cfg.upstream_timeout_seconds)
    discovery = Discovery(cfg, pool, upstream)
    try:
        await discovery.start()  # empty file: DNS is the fallback
        assert {e.generation for e in pool.endpoints} == {"new"} and pool.endpoints
        engines = [
            {"role": "prefill", "url": "http://127.0.0.1:9001", "generation": "old", "name": "p-0"},
            {"role": "decode", "url": "http://127.0.0.1:9002", "generation": "old", "name": "d-0"},
        ]
        file.write_text(json.dumps({"endpoints": engines}))
        discovery._file_mtime = None
        discovery._poll_file()
        await discovery._resolve_dns()
        assert sorted((e.url, e.generation) for e in pool.endpoints) == [
            ("http://127.0.0.1:9001", "old"),
            ("http://127.0.0.1:9002", "old"),
        ]
    finally:
        await discovery.stop()
        await upstream.close()


async def test_a_request_right_after_an_engine_recovers_is_served_without_waiting_for_the_next_check(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack()
    s.decode.healthy = False
    for _ in range(FAILURE_THRESHOLD):
        await s.router.discovery.check_all()
    assert (await http.get(s.url + "/ready")).status == 503
    s.decode.healthy = True  # back, but the periodic check has not run yet
    status, _, _ = await chat(http, s.url, [user(LONG)])
    assert status == 200
