"""The permissions the handlers need, written once; the Helm chart renders them from here.

`python -m pdx.controller.rbac` prints the ClusterRole; `--peering` prints kopf's peering
CRD and the peering object the replicas coordinate through.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from pdx import kinds, labels
from pdx.spec import GROUP, PLURAL

ROLE_NAME = "pdx-operator"
PEERING_NAME = "pdx-operator"  # settings.peering.name in handlers.configure


CHILD_VERBS = ["get", "list", "watch", "create", "patch", "delete"]
# The admission operations the child verbs that write become (server-side apply is a PATCH: UPDATE, or CREATE).
WRITE_OPERATIONS: dict[str, list[str]] = {"create": ["CREATE"], "patch": ["CREATE", "UPDATE"], "delete": ["DELETE"]}


def _child_rules() -> list[dict[str, Any]]:
    """Server-side apply, list, watch and prune of every child kind, one rule per API group."""
    groups: dict[str, list[str]] = {}
    for k in kinds.CHILDREN:
        groups.setdefault(k.group, []).append(k.plural)
    return [{"apiGroups": [g], "resources": plurals, "verbs": list(CHILD_VERBS)} for g, plurals in groups.items()]


def namespaced_rules() -> list[dict[str, Any]]:
    """What the operator does inside a namespace it serves: watch the CR and patch it and its
    status; server-side apply, list and prune the children; watch the children kopf reacts to;
    read pods for readiness and endpoints; post events; kopf's namespaced peering. With
    watched namespaces the chart grants exactly these by a Role in each."""
    return [
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["get", "patch"]},
        *_child_rules(),
        {"apiGroups": [kinds.POD.group], "resources": [kinds.POD.plural], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]},
        # kopf peering of an operator serving namespaces (`--namespace`): one object in each.
        {"apiGroups": ["kopf.dev"], "resources": ["kopfpeerings"], "verbs": ["list", "watch", "patch", "get"]},
    ]


def cluster_scoped_rules(*, clusterwide: bool) -> list[dict[str, Any]]:
    """What only a ClusterRole can grant, all of it read-only but kopf's cluster peering:
    kopf discovers resources from the CRDs and follows namespaces (it falls back to the names
    it was given without them); `--all-namespaces` peers through a ClusterKopfPeering."""
    out: list[dict[str, Any]] = [
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
    ]
    if clusterwide:
        out.append(
            {
                "apiGroups": ["kopf.dev"],
                "resources": ["clusterkopfpeerings"],
                "verbs": ["list", "watch", "patch", "get"],
            }
        )
    return out


def rbac_rules() -> list[dict[str, Any]]:
    """The ClusterRole of an operator serving all namespaces: every namespaced right in every
    namespace (the chart's admission policy then confines its writes to pdx's own objects)."""
    return [*namespaced_rules(), *cluster_scoped_rules(clusterwide=True)]


def cluster_role() -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": ROLE_NAME, "labels": {labels.NAME: labels.MANAGER}},
        "rules": rbac_rules(),
    }


def _peering_crd(kind: str, plural: str, scope: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.kopf.dev"},
        "spec": {
            "scope": scope,
            "group": "kopf.dev",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                        }
                    },
                }
            ],
        },
    }


def peering_manifests() -> list[dict[str, Any]]:
    """kopf's peering CRDs plus the cluster-wide peering object the operator replicas share."""
    return [
        _peering_crd("ClusterKopfPeering", "clusterkopfpeerings", "Cluster"),
        _peering_crd("KopfPeering", "kopfpeerings", "Namespaced"),
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": PEERING_NAME}},
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pdx.controller.rbac", description=__doc__)
    p.add_argument("--peering", action="store_true", help="print the peering CRDs and object instead")
    args = p.parse_args(argv)
    docs = peering_manifests() if args.peering else [cluster_role()]
    sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
