"""The documents the operator renders load in the router: whatever the API accepts, the router
accepts; what the router would refuse, the API refuses first, naming the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdx.render import config_hash, ready_engine, render
from pdx.render.engines import kv_transfer_config
from pdx.render.meta import ROLES
from pdx.resource import SpecError, load
from pdx_contract.router_config import RouterConfig
from pdx_contract.stats import REUSE_OUTCOMES, RouterStats
from pdx_router.config import parse_config
from pdx_router.discovery import read_endpoints_file
from pdx_router.metrics import Metrics
from pdx_router.policy import Outcome

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
MINIMAL: dict[str, Any] = {
    "apiVersion": "inference.pdx.dev/v1alpha1",
    "kind": "DisaggregatedInference",
    "metadata": {"name": "edge", "namespace": "inference"},
    "spec": {"model": {"name": "Qwen/Qwen3-32B"}},
}


def _with(**spec: Any) -> dict[str, Any]:
    doc = copy.deepcopy(MINIMAL)
    doc["spec"].update(spec)
    return doc


# The smallest values the CRD admits, and every optional router field set and unset.
EDGES = {
    "minimal": MINIMAL,
    "smallest decoder TTL": _with(kvTransfer={"decoderKvBlocksTtlSeconds": 6}),
    "decoder TTL at the margin switch": _with(kvTransfer={"decoderKvBlocksTtlSeconds": 60}),
    "smallest lease": _with(kvTransfer={"kvLeaseDurationSeconds": 6}),
    "largest lease": _with(kvTransfer={"kvLeaseDurationSeconds": 3600}),
    "threshold 0": _with(kvTransfer={"kvRecomputeThreshold": 0}),
    "no bidirectional transfer": _with(kvTransfer={"bidirectional": False}),
    "smallest router TTL": _with(router={"conversationTtlSeconds": 1}),
    "largest router TTL": _with(kvTransfer={"decoderKvBlocksTtlSeconds": 480}, router={"conversationTtlSeconds": 475}),
    "one entry": _with(router={"maxEntries": 1}),
    "tenant header": _with(router={"tenantHeader": "X-Tenant"}),
    "redis store": _with(router={"replicas": 2, "store": {"kind": "redis", "url": "redis://redis:6379/0"}}),
    "router tokenizer": _with(
        model={"name": "/models/qwen"}, modelCache={"claimName": "models"}, router={"tokenizer": "router"}
    ),
    "router port": _with(router={"port": 1}),
}
CASES = {**{p.stem: yaml.safe_load(p.read_text()) for p in EXAMPLES}, **EDGES}


def _data(objects: list[dict[str, Any]], key: str) -> str:
    text: str = next(o["data"][key] for o in objects if o["kind"] == "ConfigMap" and key in o.get("data", {}))
    return text


@pytest.mark.parametrize("doc", CASES.values(), ids=CASES.keys())
def test_every_admitted_spec_renders_a_router_config_the_router_loads(doc: dict[str, Any]) -> None:
    target = load(doc)
    cfg = parse_config(_data(render(target), "router.json"))
    assert cfg.conversation_ttl_seconds == target.spec.router_ttl > 0
    assert cfg.kv_recompute_threshold == target.spec.kv_transfer.kv_recompute_threshold
    assert cfg.generation == config_hash(target)


@pytest.mark.parametrize("doc", CASES.values(), ids=CASES.keys())
def test_every_admitted_spec_renders_one_lease_both_roles_can_renew(doc: dict[str, Any]) -> None:
    leases = {kv_transfer_config(load(doc), role)["kv_connector_extra_config"]["kv_lease_duration"] for role in ROLES}
    assert len(leases) == 1  # decode heartbeats by its value, prefill renews by its own
    (lease,) = leases
    assert lease // 6 >= 1  # NixlConnector's heartbeat interval: 0 would send one every engine step


@pytest.mark.parametrize("doc", CASES.values(), ids=CASES.keys())
def test_the_published_endpoints_load_in_the_router(doc: dict[str, Any], tmp_path: Path) -> None:
    target = load(doc)
    gen = config_hash(target)
    ready = [ready_engine("prefill", "p-0", "10.0.0.1", gen), ready_engine("decode", "d-0", "fd00::2", gen)]
    path = tmp_path / "endpoints.json"
    path.write_text(_data(render(target, ready), "endpoints.json"))
    found = read_endpoints_file(str(path), "unused")
    assert [(e.role, e.url, e.generation) for e in found] == [
        ("decode", "http://[fd00::2]:8000", gen),
        ("prefill", "http://10.0.0.1:8000", gen),
    ]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"kvTransfer": {"decoderKvBlocksTtlSeconds": 5}}, "spec.kvTransfer.decoderKvBlocksTtlSeconds"),
        ({"router": {"conversationTtlSeconds": 0}}, "spec.router.conversationTtlSeconds"),
        ({"kvTransfer": {"kvRecomputeThreshold": -1}}, "spec.kvTransfer.kvRecomputeThreshold"),
        ({"kvTransfer": {"kvLeaseDurationSeconds": 5}}, "spec.kvTransfer.kvLeaseDurationSeconds"),
        ({"router": {"maxEntries": 0}}, "spec.router.maxEntries"),
        ({"router": {"port": 0}}, "spec.router.port"),
        ({"router": {"store": {"kind": "redis"}}}, "spec.router.store"),
    ],
)
def test_what_the_router_would_refuse_the_api_refuses_first_naming_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        load(_with(**spec))
    assert any(p.startswith(field) for p in err.value.problems), err.value.problems


def test_the_router_config_carries_every_default_so_the_router_needs_none_of_its_own() -> None:
    wire = parse_config(_data(render(load(MINIMAL)), "router.json")).to_json()
    assert set(wire) == {f.alias for f in RouterConfig.model_fields.values()}


def test_the_routers_stats_are_the_document_the_operator_reads() -> None:
    metrics = Metrics()
    for outcome in (Outcome.HIT, Outcome.HIT, Outcome.MISS, Outcome.EXPIRED):
        metrics.outcome(outcome, tokens=10)
    stats = RouterStats.model_validate(metrics.stats(entries=3, router_tokenizer="trusted").to_json())
    assert (stats.reuse.hit, stats.reuse.miss, stats.reuse.expired, stats.reused_tokens) == (2, 1, 1, 40)
    assert {o.value for o in Outcome} - {"none"} == set(REUSE_OUTCOMES)
