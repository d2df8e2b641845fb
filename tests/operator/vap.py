"""Evaluates a ValidatingAdmissionPolicy as the API server does, with cel-python.

A request the policy's matchConstraints or matchConditions leave out is admitted untouched;
a matched one is denied by the first validation that is not true. The activation carries the
variables the API server gives the expressions: `request`, `object` (null for DELETE) and
`oldObject` (null for CREATE).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import celpy
from celpy.adapter import json_to_cel


@dataclass(frozen=True)
class Verdict:
    matched: bool
    allowed: bool
    message: str | None = None


def _matches_rules(spec: dict[str, Any], group: str, version: str, resource: str, operation: str) -> bool:
    for rule in spec["matchConstraints"]["resourceRules"]:
        if (
            group in rule["apiGroups"]
            and version in rule["apiVersions"]
            and resource in rule["resources"]
            and operation in rule["operations"]
        ):
            return True
    return False


def _true(expression: str, activation: dict[str, Any]) -> bool:
    env = celpy.Environment()
    return bool(env.program(env.compile(expression)).evaluate(activation))


def review_expression(
    expression: str, request: dict[str, Any], obj: dict[str, Any] | None, old: dict[str, Any] | None
) -> bool:
    """One expression alone, as a validation or match condition sees the request."""
    activation = {"request": json_to_cel(request), "object": json_to_cel(obj), "oldObject": json_to_cel(old)}
    return _true(expression, activation)


def review(
    policy: dict[str, Any],
    *,
    user: str,
    operation: str,
    api_version: str,
    resource: str,
    namespace: str,
    obj: dict[str, Any] | None = None,
    old: dict[str, Any] | None = None,
) -> Verdict:
    """The policy's answer to one admission request."""
    group, _, version = api_version.rpartition("/")
    spec = policy["spec"]
    if not _matches_rules(spec, group, version, resource, operation):
        return Verdict(matched=False, allowed=True)
    name = (obj or old or {}).get("metadata", {}).get("name", "")
    request = {
        "operation": operation,
        "namespace": namespace,
        "name": name,
        "userInfo": {"username": user},
        "resource": {"group": group, "version": version, "resource": resource},
    }
    activation = {"request": json_to_cel(request), "object": json_to_cel(obj), "oldObject": json_to_cel(old)}
    if not all(_true(c["expression"], activation) for c in spec.get("matchConditions", [])):
        return Verdict(matched=False, allowed=True)
    for validation in spec["validations"]:
        if not _true(validation["expression"], activation):
            return Verdict(matched=True, allowed=False, message=validation["message"])
    return Verdict(matched=True, allowed=True)
