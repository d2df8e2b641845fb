"""The admission policy lets the operator write pdx's own objects and nothing else, and leaves
every other user alone: its CEL evaluated against admission requests (tests/operator/vap.py)."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from pdx import kinds
from pdx.controller import admission
from pdx.render import render
from pdx.resource import load
from tests.operator.vap import review, review_expression

OPERATOR = admission.service_account_user("pdx-system", "pdx-pdx-operator")
ADMIN = "kubernetes-admin"
POLICY = admission.policy(OPERATOR)
AWS_AUTH: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "aws-auth", "namespace": "kube-system"},
    "data": {"mapRoles": "- rolearn: arn:aws:iam::111122223333:role/nodes\n"},
}
FOREIGN_DEPLOYMENT: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "billing", "namespace": "inference", "labels": {"app": "billing"}},
}


def children() -> list[dict[str, Any]]:
    """What the operator applies for a resource it read from the API (owner references set)."""
    return render(
        load(
            {
                "apiVersion": "inference.pdx.dev/v1alpha1",
                "kind": "DisaggregatedInference",
                "metadata": {"name": "demo", "namespace": "inference", "uid": "0d2c3b3e-1111-2222-3333-444455556666"},
                "spec": {"model": {"name": "Qwen/Qwen3-32B"}},
            }
        )
    )


def ask(obj: dict[str, Any], operation: str, user: str = OPERATOR, old: dict[str, Any] | None = None) -> Any:
    plural = kinds.PLURALS[(obj["apiVersion"], obj["kind"])]
    return review(
        POLICY,
        user=user,
        operation=operation,
        api_version=obj["apiVersion"],
        resource=plural,
        namespace=obj["metadata"]["namespace"],
        obj=None if operation == "DELETE" else obj,
        old=old if operation != "CREATE" else None,
    )


def test_the_policy_and_binding_are_valid_kubernetes_objects() -> None:
    for obj in (POLICY, admission.binding()):
        kubernetes_validate.validate(obj, "1.37.0", strict=True)


def test_it_matches_every_child_kind_for_create_update_and_delete() -> None:
    matched = {
        (g, r, op)
        for rule in POLICY["spec"]["matchConstraints"]["resourceRules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for op in rule["operations"]
    }
    assert matched == {(k.group, k.plural, op) for k in kinds.CHILDREN for op in ("CREATE", "UPDATE", "DELETE")}


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_the_operator_may_write_every_object_it_renders(operation: str) -> None:
    for obj in children():
        verdict = ask(obj, operation, old=obj)
        # Not matched: the validations' match condition finds nothing to refuse (refused_condition).
        assert not verdict.matched and verdict.allowed, (obj["kind"], obj["metadata"]["name"], verdict.message)


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_the_operator_s_write_is_matched_exactly_when_a_validation_refuses_it(operation: str) -> None:
    """The refused-write condition is the validations' conjunction, negated: no write one of them
    would refuse skips them, and a write none refuses is spared their second evaluation."""
    orphan = copy.deepcopy(children()[0])
    del orphan["metadata"]["ownerReferences"]
    planted = copy.deepcopy(children()[1])
    planted["metadata"]["namespace"] = "kube-system"
    relabelled = copy.deepcopy(children()[2])
    for obj, old in [(o, o) for o in (*children(), AWS_AUTH, FOREIGN_DEPLOYMENT, orphan, planted)] + [
        (relabelled, FOREIGN_DEPLOYMENT)
    ]:
        verdict = ask(obj, operation, old=old)
        request = {"operation": operation, "namespace": obj["metadata"]["namespace"]}
        refused = any(
            not review_expression(v["expression"], request, None if operation == "DELETE" else obj,
                                  None if operation == "CREATE" else old)
            for v in admission.validations()
        )  # fmt: skip
        assert verdict.matched == refused and verdict.allowed == (not refused), (obj["metadata"]["name"], verdict)


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_the_operator_may_not_touch_aws_auth_or_another_teams_deployment(operation: str) -> None:
    for obj in (AWS_AUTH, FOREIGN_DEPLOYMENT):
        verdict = ask(obj, operation, old=obj)
        assert verdict.matched and not verdict.allowed, obj["metadata"]["name"]
        assert verdict.message and "pdx operator" in verdict.message


def test_relabelling_a_foreign_object_as_pdxs_does_not_let_the_operator_take_it() -> None:
    pdx_style = copy.deepcopy(children()[0])
    pdx_style["metadata"]["name"] = FOREIGN_DEPLOYMENT["metadata"]["name"]
    verdict = ask(pdx_style, "UPDATE", old=FOREIGN_DEPLOYMENT)
    assert not verdict.allowed and verdict.message is not None and "not pdx's" in verdict.message


def test_pdx_labels_without_a_controlling_disaggregated_inference_are_refused() -> None:
    orphan = copy.deepcopy(children()[0])
    del orphan["metadata"]["ownerReferences"]
    verdict = ask(orphan, "CREATE")
    assert not verdict.allowed and verdict.message is not None and "ownerReferences" in verdict.message


def test_even_pdx_labelled_objects_are_refused_in_kube_system() -> None:
    planted = copy.deepcopy(children()[0])
    planted["metadata"]["namespace"] = "kube-system"
    for operation in ("CREATE", "UPDATE", "DELETE"):
        assert not ask(planted, operation, old=planted).allowed


def test_other_users_and_service_accounts_are_not_matched() -> None:
    for user in (ADMIN, admission.service_account_user("kube-system", "aws-node"),
                 admission.service_account_user("other-ns", "pdx-pdx-operator")):  # fmt: skip
        for operation in ("CREATE", "UPDATE", "DELETE"):
            verdict = ask(AWS_AUTH, operation, user=user, old=AWS_AUTH)
            assert not verdict.matched and verdict.allowed


def test_kinds_the_operator_does_not_write_are_not_matched() -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf-token", "namespace": "inference"}}
    verdict = review(POLICY, user=OPERATOR, operation="CREATE", api_version="v1", resource="secrets",
                     namespace="inference", obj=secret)  # fmt: skip
    assert not verdict.matched  # RBAC gives it no rights on them at all
