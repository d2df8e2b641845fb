"""Autoscaled roles: an HPA per role, and an operator that never fights it over replicas."""

from __future__ import annotations

from typing import Any

import kubernetes_validate

from pdx.controller.reconcile import HANDOVER_MANAGER, replicas_handover
from pdx.render import config_hash, render
from pdx.resource import load
from tests.operator.conftest import NS, cr_document

AUTO = {"minReplicas": 1, "maxReplicas": 4}


def _objects(**spec: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in render(load(cr_document(**spec)))}


def test_an_autoscaled_role_gets_an_hpa_on_its_engines_metric_and_a_statefulset_without_replicas() -> None:
    objs = _objects(prefill={"replicas": 2}, decode={"replicas": 2, "autoscaling": AUTO})
    hpa = objs[("HorizontalPodAutoscaler", "demo-decode")]
    kubernetes_validate.validate(hpa, "1.37.0", strict=True)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "demo-decode"}
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "vllm_kv_cache_usage_perc"
    assert hpa["spec"]["behavior"]["scaleDown"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 120}]
    assert "replicas" not in objs[("StatefulSet", "demo-decode")]["spec"]
    assert objs[("StatefulSet", "demo-prefill")]["spec"]["replicas"] == 2  # not autoscaled: as before
    assert ("HorizontalPodAutoscaler", "demo-prefill") not in objs


def test_turning_autoscaling_on_or_off_does_not_roll_the_engines() -> None:
    plain = load(cr_document())
    auto = load(cr_document(decode={"replicas": 2, "autoscaling": {**AUTO, "target": "500m"}}))
    assert config_hash(plain) == config_hash(auto)


def _live_sts(owner: str, replicas: int = 2) -> dict[str, Any]:
    fields: dict[str, Any] = {"f:spec": {"f:replicas": {}, "f:serviceName": {}}}
    return {
        "metadata": {"managedFields": [{"manager": owner, "operation": "Apply", "fieldsV1": fields}]},
        "spec": {"replicas": replicas},
    }


def test_turning_autoscaling_on_first_hands_the_live_count_to_another_manager() -> None:
    desired = _objects(decode={"replicas": 2, "autoscaling": AUTO})[("StatefulSet", "demo-decode")]
    held = replicas_handover(desired, _live_sts("pdx-operator", 3), "pdx-operator")
    assert held == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "demo-decode", "namespace": NS},
        "spec": {"replicas": 3},  # the pods running now, not the spec's 2 nor the default 1
    }
    assert HANDOVER_MANAGER != "pdx-operator"
    # Nothing to hand over: already another manager's, replicas still rendered, or no live set.
    assert replicas_handover(desired, _live_sts("kube-controller-manager"), "pdx-operator") is None
    rendered = _objects(decode={"replicas": 2})[("StatefulSet", "demo-decode")]
    assert replicas_handover(rendered, _live_sts("pdx-operator"), "pdx-operator") is None
    assert replicas_handover(desired, None, "pdx-operator") is None
