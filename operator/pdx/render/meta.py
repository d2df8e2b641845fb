"""Names, labels, owner references and config hashes shared by every rendered child."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pdx import labels as labels_
from pdx.resource import Target
from pdx.spec import API_VERSION, KIND

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, Role] = ("prefill", "decode")


HTTP_PORT = 8000


def canonical_hash(value: Any, length: int = 10) -> str:
    data = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(data).hexdigest()[:length]


def config_hash(target: Target) -> str:
    """The engine config generation: everything both roles must agree on, minus scale.

    Replica counts, autoscaling, the router and the network peers are left out, so scaling does
    not roll the engines, while a changed TTL, threshold or bidirectional switch rolls both roles
    to one new generation.
    """
    doc = target.spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    doc.pop("router", None)
    doc.pop("network", None)  # NetworkPolicies only: the pods stay as they are
    doc.pop("monitoring", None)  # scraping is no engine config: turning it on must not roll them
    for role in ROLES:
        doc[role].pop("replicas", None)
        doc[role].pop("autoscaling", None)  # scale, too
    return canonical_hash(doc)


def selector(target: Target, component: str) -> dict[str, str]:
    return {**labels_.instance(target.name), labels_.COMPONENT: component}


def labels(target: Target, component: str) -> dict[str, str]:
    out = {
        **selector(target, component),
        labels_.PART_OF: labels_.APP,
        labels_.MANAGED_BY: labels_.MANAGER,
    }
    if component in ROLES:
        out[labels_.ROLE] = component
        out[labels_.ENGINE] = "true"
    return out


def metadata(target: Target, name: str, component: str, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": target.namespace,
        "labels": labels(target, component),
    }
    if target.uid:
        meta["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": target.name,
                "uid": target.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    meta.update(extra)
    return meta


def engine_name(target: Target, role: Role) -> str:
    return f"{target.name}-{role}"


def router_name(target: Target) -> str:
    return f"{target.name}-router"


def router_url(target: Target) -> str:
    """The router's Service, as the operator (stats) and draining decodes reach it."""
    return f"http://{router_name(target)}.{target.namespace}.svc:{target.spec.router.port}"


def endpoints_name(target: Target) -> str:
    return f"{target.name}-endpoints"
