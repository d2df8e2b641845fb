"""spec.monitoring.podMonitors: a PodMonitor for every pod serving /metrics, and nothing without it."""

from __future__ import annotations

import re
from typing import Any

from pdx import kinds
from pdx.controller.rbac import rbac_rules
from pdx.monitoring import COMPONENT_LABEL, INSTANCE_LABEL, alerts, dashboard
from pdx.render import config_hash, render
from pdx.resource import Target
from tests.render.test_render import target


def _pods(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pod templates of the rendered workloads, with their metadata."""
    return [o["spec"]["template"] for o in objects if o["kind"] in ("StatefulSet", "Deployment")]


def _monitored() -> tuple[Target, dict[str, Any], list[dict[str, Any]]]:
    t = target(spec__monitoring={"podMonitors": True})
    objects = render(t)
    (pm,) = [o for o in objects if o["kind"] == "PodMonitor"]
    return t, pm, objects


def test_nothing_of_the_prometheus_operator_is_rendered_unless_asked() -> None:
    assert "PodMonitor" not in {o["kind"] for o in render(target())}


def test_the_pod_monitor_selects_every_engine_and_router_pod_on_a_port_each_serves() -> None:
    t, pm, objects = _monitored()
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["metadata"]["namespace"] == t.namespace
    selector = pm["spec"]["selector"]["matchLabels"]
    pods = _pods(objects)
    assert {p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods} == {"prefill", "decode", "router"}
    for pod in pods:
        assert selector.items() <= pod["metadata"]["labels"].items()
        ports = {port["name"] for c in pod["spec"]["containers"] for port in c.get("ports", [])}
        assert all(e["port"] in ports for e in pm["spec"]["podMetricsEndpoints"])


def test_scraped_series_get_the_labels_the_alerts_and_panels_group_by() -> None:
    _, pm, objects = _monitored()
    relabel = pm["spec"]["podMetricsEndpoints"][0]["relabelings"]
    targets = {r["targetLabel"]: r["sourceLabels"][0] for r in relabel}
    assert set(targets) == {INSTANCE_LABEL, COMPONENT_LABEL}
    # Prometheus's discovery label of each pod label the PodMonitor reads.
    pod_labels = _pods(objects)[0]["metadata"]["labels"]
    sanitized = {"__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9]", "_", k): k for k in pod_labels}
    assert sanitized[targets[INSTANCE_LABEL]] == "app.kubernetes.io/instance"
    assert sanitized[targets[COMPONENT_LABEL]] == "app.kubernetes.io/component"
    grouped = [a.expr for a in alerts.ALERTS] + dashboard.queries()
    assert any(INSTANCE_LABEL in e for e in grouped) and any(COMPONENT_LABEL in e for e in grouped)


def test_turning_scraping_on_does_not_roll_the_engines() -> None:
    assert config_hash(target(spec__monitoring={"podMonitors": True})) == config_hash(target())


def test_pod_monitors_are_a_child_kind_the_operator_may_apply_and_prune() -> None:
    assert ("monitoring.coreos.com/v1", "PodMonitor") in {(k.api_version, k.kind) for k in kinds.CHILDREN}
    assert any(
        r["apiGroups"] == ["monitoring.coreos.com"] and r["resources"] == ["podmonitors"] and "create" in r["verbs"]
        for r in rbac_rules()
    )
