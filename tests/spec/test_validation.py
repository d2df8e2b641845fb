"""The models and the API server (schema + CEL) accept and reject the same specs, naming the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdx.resource import SpecError, parse_spec
from tests.spec.k8s_api import api_server_errors

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))
BASE: dict[str, Any] = {"model": {"name": "Qwen/Qwen3-32B"}}


def with_(patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(BASE)
    for dotted, value in patch.items():
        node = out
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


# (what is wrong, the spec patch, the field both must name)
INVALID = [
    ("TTL below 1", {"kvTransfer.decoderKvBlocksTtlSeconds": 0}, "spec.kvTransfer.decoderKvBlocksTtlSeconds"),
    ("negative threshold", {"kvTransfer.kvRecomputeThreshold": -1}, "spec.kvTransfer.kvRecomputeThreshold"),
    (
        "lease below a 1 s heartbeat",
        {"kvTransfer.kvLeaseDurationSeconds": 5},
        "spec.kvTransfer.kvLeaseDurationSeconds",
    ),
    ("lease above an hour", {"kvTransfer.kvLeaseDurationSeconds": 3601}, "spec.kvTransfer.kvLeaseDurationSeconds"),
    ("unknown backend", {"kvTransfer.backends": ["TCP"]}, "spec.kvTransfer.backends[0]"),
    ("typo in a field name", {"kvTransfer.decoderTtl": 100}, "spec.kvTransfer.decoderTtl"),
    ("missing model", {"model": None}, "spec.model"),
    (
        "router TTL not below decoder TTL minus the decline window",
        {"kvTransfer.decoderKvBlocksTtlSeconds": 100, "router.conversationTtlSeconds": 96},
        "spec.router.conversationTtlSeconds",
    ),
    ("prefill TP beyond the node's GPUs", {"prefill.tensorParallelSize": 16}, "spec.prefill.tensorParallelSize"),
    (
        "decode TP beyond an override of GPUs per node",
        {"placement.gpusPerNode": 4, "decode.tensorParallelSize": 8},
        "spec.decode.tensorParallelSize",
    ),
    (
        "TP sizes that do not divide one another",
        {"prefill.tensorParallelSize": 8, "decode.tensorParallelSize": 3},
        "spec.decode.tensorParallelSize",
    ),
    (
        "recompute policy with bidirectional on",
        {"kvTransfer.loadFailurePolicy": "recompute"},
        "spec.kvTransfer.loadFailurePolicy",
    ),
    ("held KV share of nothing", {"kvTransfer.heldKvMaxFraction": 0}, "spec.kvTransfer.heldKvMaxFraction"),
    ("held KV share above the whole cache", {"kvTransfer.heldKvMaxFraction": 1.5}, "spec.kvTransfer.heldKvMaxFraction"),
    (
        "held KV share with the valve off",
        {"kvTransfer.heldKvMaxFraction": 0.5, "kvTransfer.releaseUnderPressure": False},
        "spec.kvTransfer.heldKvMaxFraction",
    ),
    (
        "first token from prefill beside a reasoning parser on decode",
        {"router.firstTokenFromPrefill": True, "decode.extraArgs": ["--reasoning-parser", "qwen3"]},
        "spec.router.firstTokenFromPrefill",
    ),
    (
        "unknown instance type without GPU counts",
        {"placement.instanceType": "g6.xlarge"},
        "spec.placement.instanceType",
    ),
    (
        "LIBFABRIC without EFA",
        {"placement.instanceType": "cpu", "kvTransfer.backends": ["LIBFABRIC"]},
        "spec.kvTransfer.backends",
    ),
    (
        "LIBFABRIC beside another backend on EFA",
        {"kvTransfer.backends": ["LIBFABRIC", "UCX"]},
        "spec.kvTransfer.backends",
    ),
    ("redis store without URL", {"router.store": {"kind": "redis"}}, "spec.router.store.url"),
    ("two routers without a shared store", {"router.replicas": 2}, "spec.router.replicas"),
    ("router tokenizer without a model cache PVC", {"router.tokenizer": "router"}, "spec.router.tokenizer"),
    (
        "router tokenizer for a hub id, not a path in the cache",
        {"router.tokenizer": "router", "modelCache.claimName": "models"},
        "spec.router.tokenizer",
    ),
    ("unknown tokenizer side", {"router.tokenizer": "client"}, "spec.router.tokenizer"),
    ("gateway identity without its header", {"router.tenancy": {"identity": "header"}}, "spec.router.tenancy.header"),
    ("a tenant header without its identity", {"router.tenancy": {"header": "X-T"}}, "spec.router.tenancy.header"),
    (
        "the deprecated tenantHeader beside tenancy",
        {"router.tenantHeader": "X-T", "router.tenancy": {"identity": "single"}},
        "spec.router.tenantHeader",
    ),
    ("unknown tenant identity", {"router.tenancy": {"identity": "ip"}}, "spec.router.tenancy.identity"),
    ("engine key Secret without a name", {"engineApiKeySecret": {"key": "k"}}, "spec.engineApiKeySecret.name"),
    (
        "autoscaling with a max below its min",
        {"decode.autoscaling": {"minReplicas": 3, "maxReplicas": 2}},
        "spec.decode.autoscaling.maxReplicas",
    ),
    ("autoscaling without a max", {"prefill.autoscaling": {"minReplicas": 1}}, "spec.prefill.autoscaling.maxReplicas"),
]


def _clean(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if v is not None}


@pytest.mark.parametrize(("why", "patch", "field"), INVALID, ids=[c[0] for c in INVALID])
def test_models_and_api_server_reject_the_same_input_naming_the_field(
    why: str, patch: dict[str, Any], field: str
) -> None:
    spec = _clean(with_(patch))
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    assert any(p.startswith(field) for p in err.value.problems), err.value.problems
    assert field in api_server_errors(spec), why


VALID = [
    ("minimal", {}),
    ("tenants named by a gateway header", {"router.tenancy": {"identity": "header", "header": "X-Tenant"}}),
    ("the deprecated tenantHeader alone", {"router.tenantHeader": "X-Tenant"}),
    ("one trusted client reading reuse facts", {"router.tenancy": {"identity": "single"}, "router.reuseHeaders": True}),
    ("engines behind an API key", {"engineApiKeySecret": {"name": "engine-key"}}),
    ("decode autoscaled on its KV", {"decode.autoscaling": {"maxReplicas": 4, "target": "600m"}}),
    ("xPyD with TP ratio 2", {"prefill.tensorParallelSize": 8, "decode.tensorParallelSize": 4}),
    ("router TTL at the limit", {"kvTransfer.decoderKvBlocksTtlSeconds": 100, "router.conversationTtlSeconds": 95}),
    ("the shortest lease", {"kvTransfer.kvLeaseDurationSeconds": 6}),
    (
        "LIBFABRIC beside UCX with the EFA check off",
        {"kvTransfer.backends": ["LIBFABRIC", "UCX"], "placement.efaCheck": False},
    ),
    (
        "the longest lease, with the shortest decoder TTL",
        {"kvTransfer.kvLeaseDurationSeconds": 3600, "kvTransfer.decoderKvBlocksTtlSeconds": 6},
    ),
    (
        "unknown instance type with counts",
        {"placement": {"instanceType": "g6e.48xlarge", "gpusPerNode": 8, "efaDevicesPerNode": 0}},
    ),
    (
        "recompute with bidirectional off",
        {"kvTransfer.bidirectional": False, "kvTransfer.loadFailurePolicy": "recompute"},
    ),
    ("two routers on redis", {"router.replicas": 2, "router.store": {"kind": "redis", "url": "redis://r:6379/0"}}),
    (
        "router tokenizer read from the cache PVC",
        {"router.tokenizer": "router", "modelCache.claimName": "models", "model.name": "/models/Qwen3-32B"},
    ),
]


@pytest.mark.parametrize(("why", "patch"), VALID, ids=[c[0] for c in VALID])
def test_models_and_api_server_accept_the_same_valid_input(why: str, patch: dict[str, Any]) -> None:
    spec = with_(patch)
    parse_spec(spec)
    assert api_server_errors(spec) == [], why


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_is_accepted_by_models_and_api_server(path: Path) -> None:
    spec = yaml.safe_load(path.read_text())["spec"]
    parse_spec(spec)
    assert api_server_errors(spec) == []


def test_defaults_of_the_models_equal_the_crd_defaults() -> None:
    from tests.spec.k8s_api import apply_defaults, spec_schema

    models = parse_spec(BASE).model_dump(by_alias=True, exclude_none=True, mode="json")
    assert apply_defaults(BASE, spec_schema()) == models


def test_router_ttl_defaults_to_decoder_ttl_minus_margin() -> None:
    assert parse_spec(BASE).router_ttl == 450
    assert parse_spec(with_({"kvTransfer.decoderKvBlocksTtlSeconds": 20})).router_ttl == 15


def test_the_lease_defaults_to_four_times_vllms_and_is_independent_of_the_other_times() -> None:
    spec = parse_spec(BASE)
    assert spec.kv_transfer.kv_lease_duration_seconds == 120  # vLLM's own default is 30
    # no rule ties it to the decoder TTL or the router's deadline (they time decode's blocks)
    short = parse_spec(with_({"kvTransfer.kvLeaseDurationSeconds": 6, "kvTransfer.decoderKvBlocksTtlSeconds": 3600}))
    assert short.router_ttl == 3570


def test_the_lease_bound_messages_name_the_field_and_the_bound() -> None:
    for value, bound in ((5, "greater than or equal to 6"), (3601, "less than or equal to 3600")):
        with pytest.raises(SpecError) as err:
            parse_spec(with_({"kvTransfer.kvLeaseDurationSeconds": value}))
        assert err.value.problems == [f"spec.kvTransfer.kvLeaseDurationSeconds: Input should be {bound} (got {value})"]


def test_crd_descriptions_read_as_prose_without_the_docstrings_line_breaks() -> None:
    from pdx.crd import crd_yaml

    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("description"), str):
                found.append(node["description"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(yaml.safe_load(crd_yaml()))
    assert len(found) > 50
    broken = [d for d in found if "\n" in d.replace("\n\n", "")]
    assert broken == []
