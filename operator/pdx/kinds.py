"""The kinds the operator reads and writes, one table: the handlers watch every kind of `ALL`
from it (kopf the CR, the operator's own feeds the rest), the kube layer builds paths from it,
RBAC grants from it, and `ListReads` lists the children by it."""

from __future__ import annotations

from dataclasses import dataclass

from pdx.spec import API_VERSION, KIND, PLURAL


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    watched: bool = False
    """Its events trigger a pass (a deleted or hand-edited child comes back at once); every
    kind is watched into the operator's state, the others are repaired by the timer."""

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]


# What `render` produces, in no particular order (render decides the apply order).
CHILDREN: tuple[Kind, ...] = (
    Kind("v1", "Service", "services"),
    Kind("apps/v1", "StatefulSet", "statefulsets", watched=True),
    Kind("v1", "ConfigMap", "configmaps"),
    Kind("apps/v1", "Deployment", "deployments", watched=True),
    Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    Kind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers"),
    # Rendered only with spec.monitoring.podMonitors; listing it where the Prometheus Operator
    # is not installed finds nothing (a 404 is an empty list), so such clusters are unaffected.
    Kind("monitoring.coreos.com/v1", "PodMonitor", "podmonitors"),
)
RESOURCE = Kind(API_VERSION, KIND, PLURAL)
POD = Kind("v1", "Pod", "pods")  # read for readiness and the endpoints file
ALL: tuple[Kind, ...] = (*CHILDREN, RESOURCE, POD)
PLURALS: dict[tuple[str, str], str] = {(k.api_version, k.kind): k.plural for k in ALL}
