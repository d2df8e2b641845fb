"""The router's memory limit follows its entry store's bound: derived when unset, and a given
one too small for the store is refused by the models and the API server alike."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pdx.render import render
from pdx.resource import SpecError, Target, parse_spec
from tests.spec.k8s_api import api_server_errors
from tests.spec.test_validation import _clean, with_

FIELD = "spec.router.resources.memory"
REDIS = "redis://r:6379/0"


def _rendered(patch: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The router container's resources and its router.json for a spec."""
    objects = render(Target("qwen", "inference", parse_spec(_clean(with_(patch)))))
    deployment = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-router"))
    configmap = next(o for o in objects if o["kind"] == "ConfigMap" and "router.json" in o.get("data", {}))
    resources = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
    return resources, json.loads(configmap["data"]["router.json"])


TOO_SMALL = [
    ("the old 1Gi beside a 1Gi store", {"router.resources": {"memory": "1Gi"}, "router.store": {"maxBytes": "1Gi"}}),
    ("512Mi beside the default 512Mi store", {"router.resources": {"memory": "512Mi"}}),
    ("a limit in decimal units just short", {"router.resources": {"memory": "1073M"}}),
]


@pytest.mark.parametrize(("why", "patch"), TOO_SMALL, ids=[c[0] for c in TOO_SMALL])
def test_a_memory_limit_below_what_the_store_needs_is_refused_naming_the_fields(
    why: str, patch: dict[str, Any]
) -> None:
    spec = _clean(with_(patch))
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    problem = next(p for p in err.value.problems if p.startswith(FIELD))
    assert "router.store.maxBytes" in problem and "leave router.resources.memory unset" in problem
    assert FIELD in api_server_errors(spec), why


ENOUGH = [
    ("the old 1Gi beside the default store (CRs defaulted before)", {"router.resources": {"memory": "1Gi"}}),
    ("640Mi beside a 256Mi store", {"router.resources": {"memory": "640Mi"}, "router.store": {"maxBytes": "256Mi"}}),
    (
        "a small limit with Redis",
        {"router.resources": {"memory": "256Mi"}, "router.store": {"kind": "redis", "url": REDIS}},
    ),
]


@pytest.mark.parametrize(("why", "patch"), ENOUGH, ids=[c[0] for c in ENOUGH])
def test_a_memory_limit_that_covers_the_store_is_accepted_and_rendered_as_given(
    why: str, patch: dict[str, Any]
) -> None:
    spec = _clean(with_(patch))
    parse_spec(spec)
    assert api_server_errors(spec) == [], why
    resources, _ = _rendered(patch)
    assert resources["limits"]["memory"] == resources["requests"]["memory"] == patch["router.resources"]["memory"]


DERIVED = [
    ("the default store", {}, "1Gi", 512 * 2**20),
    ("a 1Gi store", {"router.store": {"maxBytes": "1Gi"}}, "1792Mi", 2**30),
    ("a 100M store", {"router.store": {"maxBytes": "100M"}}, "400Mi", 10**8),
    ("Redis: no entries in the router", {"router.store": {"kind": "redis", "url": REDIS}}, "256Mi", 512 * 2**20),
]


@pytest.mark.parametrize(("why", "patch", "memory", "store_bytes"), DERIVED, ids=[c[0] for c in DERIVED])
def test_an_unset_memory_limit_is_derived_from_the_stores_bound(
    why: str, patch: dict[str, Any], memory: str, store_bytes: int
) -> None:
    resources, config = _rendered(patch)
    assert resources["limits"]["memory"] == resources["requests"]["memory"] == memory, why
    assert config["store"]["maxBytes"] == store_bytes
    # the derived limit is one the rule accepts
    pinned = _clean(with_({**patch, "router.resources": {"memory": memory}}))
    parse_spec(pinned)
    assert api_server_errors(pinned) == []


def test_the_tenant_share_reaches_the_router_in_bytes() -> None:
    _, config = _rendered({"router.store": {"maxBytes": "2Gi", "maxBytesPerTenant": "256Mi"}})
    assert config["store"]["maxBytesPerTenant"] == 256 * 2**20
    _, config = _rendered({})
    assert config["store"]["maxBytesPerTenant"] is None  # the router takes a quarter of maxBytes
