"""The PodMonitor that lets the Prometheus Operator scrape an instance, rendered only when asked.

One object covers the engines and the router: all serve /metrics on their `http` port. It copies
the pods' instance and component labels into the labels every pdx alert and panel groups by
(pdx.monitoring.INSTANCE_LABEL, COMPONENT_LABEL).
"""

from __future__ import annotations

from typing import Any

from pdx import labels
from pdx.monitoring import COMPONENT_LABEL, INSTANCE_LABEL
from pdx.render import meta
from pdx.resource import Target

PORT = "http"  # the engines' and the router's container port name


def _pod_label(name: str) -> str:
    """How Prometheus's Kubernetes discovery names a pod label (`a.b/c` -> `..._a_b_c`)."""
    return "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in name)


def pod_monitor_name(target: Target) -> str:
    return f"{target.name}-metrics"


def pod_monitors(target: Target) -> list[dict[str, Any]]:
    if not target.spec.monitoring.pod_monitors:
        return []
    relabel = [
        {"sourceLabels": [_pod_label(labels.INSTANCE)], "targetLabel": INSTANCE_LABEL},
        {"sourceLabels": [_pod_label(labels.COMPONENT)], "targetLabel": COMPONENT_LABEL},
    ]
    endpoint = {"port": PORT, "path": "/metrics", "interval": "15s", "relabelings": relabel}
    return [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": meta.metadata(target, pod_monitor_name(target), "metrics"),
            "spec": {
                "selector": {"matchLabels": labels.instance(target.name)},
                "podMetricsEndpoints": [endpoint],
            },
        }
    ]
