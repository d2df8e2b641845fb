"""The chart ships the dashboard and the alert rules only when asked, as pdx.monitoring defines them.

Installed with the real Helm library (tests/chart/helm_check.py) into a copy of the chart
whose crds/ also holds a stand-in for the Prometheus Operator's PrometheusRule CRD: a cluster
where that operator is installed.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

import kubernetes_validate
import pytest
import yaml

from pdx.monitoring import alerts, dashboard
from tests.chart.test_chart import CHART, HELM_PYTHON, KUBE_VERSION, NAMESPACE, run_helm

PROMETHEUS_RULE_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "prometheusrules.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {"kind": "PrometheusRule", "plural": "prometheusrules", "singular": "prometheusrule"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }
        ],
    },
}
SERVICE_MONITOR_CRD = {
    **PROMETHEUS_RULE_CRD,
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        **PROMETHEUS_RULE_CRD["spec"],
        "names": {"kind": "ServiceMonitor", "plural": "servicemonitors", "singular": "servicemonitor"},
    },
}
CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "operator scraped": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}}},
    "both": {
        "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "pdx"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    },
    "misspelt": {"grafanaDashboard": {"enabled": True, "label": {"grafana_dashboard": "1"}}},
}


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not HELM_PYTHON.exists():
        pytest.skip("no .venv-helm: run `bash scripts/setup-helm-env.sh` (Python 3.12 + helm-sdkpy) first")
    tmp = tmp_path_factory.mktemp("helm-monitoring")
    chart = tmp / CHART.name
    shutil.copytree(CHART, chart)
    (chart / "crds" / "zz-prometheusrule-standin.yaml").write_text(yaml.safe_dump(PROMETHEUS_RULE_CRD))
    (chart / "crds" / "zz-servicemonitor-standin.yaml").write_text(yaml.safe_dump(SERVICE_MONITOR_CRD))
    return run_helm(CASES, tmp, chart)


def _rendered(helm: dict[str, Any], case: str) -> list[dict[str, Any]]:
    install = helm["cases"][case]["install"]
    assert install["ok"], install["error"]
    assert helm["cases"][case]["lint"]["errors"] == 0, helm["cases"][case]["lint"]
    return [d for d in yaml.safe_load_all(install["manifest"]) if d]


def test_neither_is_rendered_by_default(helm: dict[str, Any]) -> None:
    objs = _rendered(helm, "defaults")
    assert "PrometheusRule" not in {o["kind"] for o in objs}
    assert not [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]


def test_dashboard_configmap_carries_the_generated_dashboard_and_the_sidecar_label(helm: dict[str, Any]) -> None:
    (cm,) = [o for o in _rendered(helm, "both") if o["kind"] == "ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "pdx"}
    assert json.loads(cm["data"]["pdx-dashboard.json"]) == dashboard.dashboard()
    kubernetes_validate.validate(cm, KUBE_VERSION, strict=True)


def test_prometheus_rule_holds_the_generated_rules_verbatim(helm: dict[str, Any]) -> None:
    (rule,) = [o for o in _rendered(helm, "both") if o["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # Helm must not have read the rules' {{ $labels.x }} templates as its own.
    assert rule["spec"] == alerts.prometheus_rule(NAMESPACE)["spec"]


def test_the_operators_service_monitor_scrapes_its_metrics_service_only_when_asked(helm: dict[str, Any]) -> None:
    assert "ServiceMonitor" not in {o["kind"] for o in _rendered(helm, "defaults")}
    objs = _rendered(helm, "operator scraped")
    (monitor,) = [o for o in objs if o["kind"] == "ServiceMonitor"]
    (service,) = [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"].endswith("-metrics")]
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert all(service["metadata"]["labels"].get(k) == v for k, v in service["spec"]["selector"].items())
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"] == "metrics"


def test_a_misspelt_dashboard_key_fails_install_naming_it(helm: dict[str, Any]) -> None:
    install = helm["cases"]["misspelt"]["install"]
    assert not install["ok"]
    assert "grafanaDashboard" in install["error"] and "label" in install["error"]
