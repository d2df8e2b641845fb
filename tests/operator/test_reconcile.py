"""Reconcile passes against kmock over real HTTP, called the way the handlers call them, where
a test needs a resource the real API server would refuse (a spec stored before a stricter CRD).
Everything else moved to tests/cluster/test_reconcile_passes.py (docs/control-plane.md)."""

from __future__ import annotations

import json
from typing import Any

from pdx.controller.kube import Kube
from pdx.controller.reconcile import Outcome, needs_apply, reconcile, stamp
from pdx.spec import API_VERSION, KIND
from tests.operator.conftest import (
    NS,
    ApiServer,
    children,
    cr_document,
    create_cr,
    in_thread,
    live,
    patch_cr,
    request_count,
    writes,
)

EXPECTED = {
    ("Service", "demo-prefill"),
    ("StatefulSet", "demo-prefill"),
    ("Service", "demo-decode"),
    ("StatefulSet", "demo-decode"),
    ("ConfigMap", "demo-router"),
    ("ConfigMap", "demo-endpoints"),
    ("Deployment", "demo-router"),
    ("Service", "demo-router"),
    ("NetworkPolicy", "demo-prefill"),
    ("NetworkPolicy", "demo-decode"),
    ("NetworkPolicy", "demo-router"),
    ("PodDisruptionBudget", "demo-prefill"),
    ("PodDisruptionBudget", "demo-decode"),
}


async def run(kube: Kube, name: str = "demo", **kw: Any) -> Outcome:
    out: Outcome | None = await in_thread(reconcile, kube, NS, name, **kw)
    assert out is not None
    return out


def conditions(api: ApiServer, name: str = "demo") -> dict[str, dict[str, Any]]:
    body = live(api, KIND, name)
    assert body is not None
    return {c["type"]: c for c in body.get("status", {}).get("conditions", [])}


def test_a_zero_value_the_api_server_leaves_out_is_no_drift() -> None:
    # A real API server stores a headless Service's `publishNotReadyAddresses: false` as
    # nothing (omitempty); against it every pass "repaired" both engine Services (tests/cluster).
    desired = stamp({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "demo-prefill", "namespace": NS},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": False, "ports": [{"port": 8000}]},
    })  # fmt: skip
    stored = json.loads(json.dumps(desired))
    del stored["spec"]["publishNotReadyAddresses"]
    stored["spec"].update(type="ClusterIP", sessionAffinity="None")  # server defaults
    stored["spec"]["ports"][0]["protocol"] = "TCP"
    assert needs_apply(desired, stored) is None
    # A hand edit to the non-zero value is still drift.
    stored["spec"]["publishNotReadyAddresses"] = True
    assert needs_apply(desired, stored) == "repaired"
    # And a non-zero rendered value missing live is too.
    del stored["spec"]["publishNotReadyAddresses"]
    del stored["spec"]["clusterIP"]
    assert needs_apply(desired, stored) == "repaired"


async def test_invalid_spec_sets_invalid_spec_and_applies_nothing(api: ApiServer, kube: Kube) -> None:
    await create_cr(api, cr_document())
    await run(kube)
    fleet_before = children(api)
    await patch_cr(api, "demo", {"spec": {"prefill": {"replicas": -1}}})
    since = request_count(api)
    out = await run(kube)
    assert writes(api, since) == [f"PATCH /apis/{API_VERSION}/namespaces/{NS}/disaggregatedinferences/demo/status"]
    assert children(api) == fleet_before
    c = conditions(api)
    assert c["InvalidSpec"]["status"] == "True" and "spec.prefill.replicas" in c["InvalidSpec"]["message"]
    assert c["Degraded"]["reason"] == "InvalidSpec"
    assert [(e.type, e.reason) for e in out.events] == [("Warning", "InvalidSpec")]
    # a second pass on the same invalid spec neither writes nor repeats the event
    since = request_count(api)
    out = await run(kube)
    assert writes(api, since) == [] and out.events == []

    await patch_cr(api, "demo", {"spec": {"prefill": {"replicas": 3}}})
    out = await run(kube)
    assert conditions(api)["InvalidSpec"]["status"] == "False"
    sts = live(api, "StatefulSet", "demo-prefill")
    assert sts is not None and sts["spec"]["replicas"] == 3
    assert "SpecValid" in [e.reason for e in out.events]
