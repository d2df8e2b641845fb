"""Tenants apart inside the engines, on real vLLM CPU engines (issue 44): with the router's default
cacheIsolation (a cache_salt per tenant), a tenant that sends another tenant's exact history finds
none of it in any engine's prefix cache, while the owner, asking right after the probe, still finds
it: the salt, not an eviction, kept them apart."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from pdx.local import default_document
from pdx.local.topology import LocalTopology
from tests.e2e.chat import chat, metric

pytest.importorskip("vllm", reason="needs the engine extra (scripts/setup.sh)")
pytestmark = [pytest.mark.engines, pytest.mark.timeout(900)]

HITS = "vllm:prefix_cache_hits_total"
HISTORY = [
    {"role": "system", "content": "You audit plant logs."},
    {"role": "user", "content": " ".join(f"Log {i}: line {i % 9} pressure {i * 17 % 83} kPa." for i in range(90))},
]


@pytest.fixture(scope="module")
def topo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTopology]:
    doc: dict[str, Any] = copy.deepcopy(default_document())
    doc["spec"]["router"]["tenancy"] = {"identity": "apiKey"}  # the default cacheIsolation: tenant
    with LocalTopology(doc, state_dir=tmp_path_factory.mktemp("tenants")) as t:
        yield t


def hits(topo: LocalTopology) -> float:
    return sum(metric(url, HITS) for role in ("prefill", "decode") for url in topo.engine_urls[role])


def test_another_tenants_exact_history_finds_nothing_cached_while_its_owner_does(topo: LocalTopology) -> None:
    router = topo.router_url
    chat(router, HISTORY, conversation=None, api_key="tenant-a")
    before = hits(topo)
    chat(router, HISTORY, conversation=None, api_key="tenant-b")  # the probe: a's exact history
    probe = hits(topo) - before
    before = hits(topo)
    chat(router, HISTORY, conversation=None, api_key="tenant-a")
    owner = hits(topo) - before
    assert probe == 0, f"tenant b found {probe:g} tokens of tenant a's history in the engines' caches"
    assert owner >= 512, f"tenant a found only {owner:g} tokens of its own history"
