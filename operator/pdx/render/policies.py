"""NetworkPolicy and PodDisruptionBudgets: who may talk to engines, how many may go at once."""

from __future__ import annotations

from typing import Any

from pdx import labels
from pdx.render import meta
from pdx.render.meta import HTTP_PORT, ROLES
from pdx.resource import Target


def _engines(target: Target) -> dict[str, Any]:
    return {
        "matchLabels": {
            **labels.instance(target.name),
            labels.ENGINE: "true",
        }
    }


def engines_network_policy(target: Target) -> dict[str, Any]:
    """Engine HTTP only from the router; NIXL only between this resource's engines.

    Engine-to-engine traffic is allowed on every port: besides the side channel, NIXL's UCX
    backend opens TCP data connections on ephemeral ports (EFA RDMA is not IP and is not
    subject to NetworkPolicy at all).
    """
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta.metadata(target, f"{target.name}-engines", "engines"),
        "spec": {
            "podSelector": _engines(target),
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": meta.selector(target, "router")}}],
                    "ports": [{"protocol": "TCP", "port": HTTP_PORT}],
                },
                {"from": [{"podSelector": _engines(target)}]},
            ],
        },
    }


def _pdb(target: Target, name: str, component: str) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta.metadata(target, name, component),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": meta.selector(target, component)},
        },
    }


def disruption_budgets(target: Target) -> list[dict[str, Any]]:
    """One engine of a role at a time; the router only when it has replicas to spare."""
    out = [_pdb(target, meta.engine_name(target, r), r) for r in ROLES if target.spec.role(r).replicas > 0]
    if target.spec.router.replicas > 1:
        out.append(_pdb(target, meta.router_name(target), "router"))
    return out
