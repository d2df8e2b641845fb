"""render(target) -> manifests: a pure function, no I/O.

The operator applies its output, `pdx render` prints it and `pdx local` runs its containers.
"""

from __future__ import annotations

from typing import Any

from pdx.render import autoscaling, engines, monitoring, policies, router
from pdx.render.meta import ROLES, config_hash
from pdx.render.router import ready_engine
from pdx.resource import Target
from pdx_contract.endpoints import PublishedEndpoint

__all__ = ["config_hash", "ready_engine", "render"]


def render(target: Target, endpoints: list[PublishedEndpoint] | None = None) -> list[dict[str, Any]]:
    """Every child object of one DisaggregatedInference, in apply order.

    `endpoints` are the ready engine pods the operator observed (none when rendering offline).
    """
    generation = config_hash(target)
    out: list[dict[str, Any]] = []
    for role in ROLES:
        out.append(engines.engine_service(target, role))
        out.append(engines.engine_statefulset(target, role, generation))
    out.append(router.router_configmap(target, generation))
    out.append(router.endpoints_configmap(target, endpoints or []))
    out.append(router.router_deployment(target, generation))
    out.append(router.router_service(target))
    out.extend(policies.network_policies(target))
    out.extend(policies.disruption_budgets(target))
    out.extend(autoscaling.autoscalers(target))
    out.extend(monitoring.pod_monitors(target))
    return out
