"""Every label, annotation and finalizer name pdx writes on objects and reads back, once."""

from __future__ import annotations

NAME = "app.kubernetes.io/name"
INSTANCE = "app.kubernetes.io/instance"
COMPONENT = "app.kubernetes.io/component"
PART_OF = "app.kubernetes.io/part-of"
MANAGED_BY = "app.kubernetes.io/managed-by"

APP = "pdx"  # NAME and PART_OF of everything an instance owns
MANAGER = "pdx-operator"  # MANAGED_BY, and the server-side apply field manager
OPERATOR = "operator"  # COMPONENT of the operator's own pods (the chart sets it)

ROLE = "pdx.dev/role"  # prefill or decode
ENGINE = "pdx.dev/engine"  # "true" on engine pods (the NetworkPolicy's peers)
CONFIG_HASH = "pdx.dev/config-hash"  # the engine config generation of a pod

ROUTER_CONFIG_HASH = "pdx.dev/router-config-hash"  # annotation: a changed router.json rolls the router
APPLIED_HASH = "pdx.dev/applied-hash"  # annotation: what the operator last applied (drift repair)
FINALIZER = "pdx.dev/operator"
KOPF_PREFIX = "pdx.dev"  # kopf's own progress and diff-base annotations


def instance(name: str) -> dict[str, str]:
    """Selects every child of one DisaggregatedInference."""
    return {NAME: APP, INSTANCE: name}


def managed() -> dict[str, str]:
    """Selects every child the operator manages, of any instance (its watches)."""
    return {MANAGED_BY: MANAGER, NAME: APP}


def operator_pods() -> dict[str, str]:
    """The operator's pods as the chart labels them: the default peer that may read the router's stats."""
    return {PART_OF: APP, COMPONENT: OPERATOR}
