"""HorizontalPodAutoscalers: one per autoscaled role, on a per-pod metric of its engines.

The StatefulSet of an autoscaled role is rendered without `replicas`, so the operator's
server-side apply never owns that field and never fights the autoscaler over it.
"""

from __future__ import annotations

from typing import Any

from pdx.render import meta
from pdx.render.meta import ROLES, Role
from pdx.resource import Target

# What each role queues on (see AutoscalingSpec): prefill its waiting prompts, decode its KV.
DEFAULT_METRICS: dict[Role, tuple[str, str]] = {
    "prefill": ("vllm_num_requests_waiting", "2"),
    "decode": ("vllm_kv_cache_usage_perc", "700m"),
}
# Scale-up waits this long for a signal to hold; scale-down the HPA's usual five minutes.
SCALE_UP_WINDOW_SECONDS = 30
SCALE_DOWN_WINDOW_SECONDS = 300


def autoscaler(target: Target, role: Role) -> dict[str, Any] | None:
    auto = target.spec.role(role).autoscaling
    if auto is None:
        return None
    name = meta.engine_name(target, role)
    metric, target_value = DEFAULT_METRICS[role]
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": meta.metadata(target, name, role),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name},
            "minReplicas": auto.min_replicas,
            "maxReplicas": auto.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": auto.metric or metric},
                        "target": {"type": "AverageValue", "averageValue": auto.target or target_value},
                    },
                }
            ],
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": SCALE_UP_WINDOW_SECONDS},
                # One pod per period: a decode on its way out drains before the next one goes.
                "scaleDown": {
                    "stabilizationWindowSeconds": SCALE_DOWN_WINDOW_SECONDS,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": auto.scale_down_period_seconds}],
                },
            },
        },
    }


def autoscalers(target: Target) -> list[dict[str, Any]]:
    return [hpa for role in ROLES if (hpa := autoscaler(target, role)) is not None]
