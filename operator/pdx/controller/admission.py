"""The admission policy that confines an all-namespaces operator to pdx's own objects.

RBAC cannot say "only objects pdx made": a ClusterRole that lets the operator apply and prune
Deployments, ConfigMaps and the rest grants it every namespace's, kube-system's included (on
EKS, the aws-auth ConfigMap). This ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1,
GA in Kubernetes 1.30) closes the gap: requests from the operator's ServiceAccount that create,
change or delete a child kind are denied unless the object, before and after, carries pdx's
labels (`labels.managed()`) and a controller reference to a DisaggregatedInference, and never
in the cluster's own namespaces. Nobody else's requests are matched. The chart renders it from
here (scripts/sync_chart.py); the kinds and verbs are `pdx.kinds` and `pdx.controller.rbac`'s.

The validations are also a match condition (`refused_condition`): a write of the operator's that
passes them all is not matched, so the validations are evaluated only for a write they refuse,
and then give its message. The API server (1.36) turns the object into CEL's form once for the
match conditions and once more for the validations; that conversion was nearly all of the
policy's cost, about a tenth of the API server's CPU while 400 resources converged (issue 42).

`python -m pdx.controller.admission NAMESPACE SERVICEACCOUNT` prints the policy and its binding.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from pdx import kinds, labels
from pdx.controller import rbac
from pdx.spec import API_VERSION, KIND

POLICY_NAME = "pdx-operator-owned-objects"
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")


def resource_rules() -> list[dict[str, Any]]:
    """The child kinds, one rule per group/version, with the operations their write verbs become."""
    operations = sorted({op for verb in rbac.CHILD_VERBS for op in rbac.WRITE_OPERATIONS.get(verb, [])})
    groups: dict[tuple[str, str], list[str]] = {}
    for k in kinds.CHILDREN:
        groups.setdefault((k.group, k.version), []).append(k.plural)
    return [
        {"apiGroups": [g], "apiVersions": [v], "resources": plurals, "operations": list(operations)}
        for (g, v), plurals in groups.items()
    ]


def _labelled(obj: str) -> str:
    checks = " && ".join(f"'{k}' in {obj}.metadata.labels && {obj}.metadata.labels['{k}'] == '{v}'"
                         for k, v in labels.managed().items())  # fmt: skip
    return f"has({obj}.metadata.labels) && {checks}"


def validations() -> list[dict[str, str]]:
    """CEL over the request: what the operator may write. DELETE has only `oldObject`, CREATE only `object`."""
    owner = (
        "has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, "
        f"r.apiVersion == '{API_VERSION}' && r.kind == '{KIND}' && has(r.controller) && r.controller)"
    )
    system = ", ".join(f"'{n}'" for n in SYSTEM_NAMESPACES)
    managed = ", ".join(f"{k}={v}" for k, v in labels.managed().items())
    return [
        {
            "expression": f"!(request.namespace in [{system}])",
            "message": f"the pdx operator never writes in {', '.join(SYSTEM_NAMESPACES)}",
            "reason": "Forbidden",
        },
        {
            "expression": f"request.operation == 'CREATE' || ({_labelled('oldObject')})",
            "message": f"the pdx operator may change or delete only objects labelled {managed}: this one is not pdx's",
            "reason": "Forbidden",
        },
        {
            "expression": f"request.operation == 'DELETE' || ({_labelled('object')})",
            "message": f"the pdx operator may write only objects labelled {managed}",
            "reason": "Forbidden",
        },
        {
            "expression": f"request.operation == 'DELETE' || ({owner})",
            "message": f"the pdx operator may write only objects a {KIND} controls (ownerReferences)",
            "reason": "Forbidden",
        },
    ]


def match_condition(username: str) -> dict[str, str]:
    """Only the operator's own requests are checked."""
    return {"name": "pdx-operator-only", "expression": f"request.userInfo.username == '{username}'"}


def refused_condition() -> dict[str, str]:
    """Matches only a write some validation refuses: the rest skip the validations' evaluation.

    CEL's `&&` gives false if any side is false, even where another side fails to evaluate, and
    fails only if none is false; a failing condition denies (failurePolicy Fail) as a failing
    validation did.
    """
    passes = " && ".join(f"({v['expression']})" for v in validations())
    return {"name": "pdx-operator-write-refused", "expression": f"!({passes})"}


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def policy(username: str, name: str = POLICY_NAME) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": {labels.NAME: labels.MANAGER}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": resource_rules()},
            "matchConditions": [match_condition(username), refused_condition()],
            "validations": validations(),
        },
    }


def binding(name: str = POLICY_NAME) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": {labels.NAME: labels.MANAGER}},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pdx.controller.admission", description=__doc__)
    p.add_argument("namespace", help="the operator's namespace")
    p.add_argument("service_account", help="the operator's ServiceAccount")
    args = p.parse_args(argv)
    user = service_account_user(args.namespace, args.service_account)
    sys.stdout.write(yaml.safe_dump_all([policy(user), binding()], sort_keys=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
