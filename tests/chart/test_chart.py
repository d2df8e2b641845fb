"""The chart, linted and installed by the real Helm library, renders valid Kubernetes objects.

Helm runs in .venv-helm (helm-sdkpy needs Python 3.12; `bash scripts/setup-helm-env.sh`)
through tests/chart/helm_check.py; this module gives it the cases and checks its answers:
every object Helm sent to the (emulated) API server validates against the Kubernetes 1.37
schema, strictly; the sample DisaggregatedInference passes the CRD's schema and CEL rules.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from pdx import kinds, labels
from pdx.controller import admission, rbac
from pdx.render import render
from pdx.resource import load, parse_spec
from tests.chart import load_sync_chart
from tests.operator.vap import review
from tests.spec.k8s_api import api_server_errors

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "pdx-operator"
HELM_PYTHON = ROOT / ".venv-helm" / "bin" / "python"
HELM_CHECK = Path(__file__).with_name("helm_check.py")
KUBE_VERSION = "1.37.0"
NAMESPACE = "pdx-system"
DIGEST = "sha256:" + "ab" * 32
sync_chart = load_sync_chart()

VALID_CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "ha-sample-custom-image": {
        "replicaCount": 2,
        "sample": {"enabled": True, "namespace": "inference"},
        "image": {"repository": "registry.example.internal/ml/pdx-operator", "tag": DIGEST},
        "imagePullSecrets": ["regcred"],
        "operator": {"logFormat": "plain", "verbose": True, "extraArgs": ["--priority=200"]},
        "podAnnotations": {"team": "inference"},
    },
    "watched-namespaces": {
        "watchNamespaces": ["inference", "research"],
        "replicaCount": 2,
    },
    "no-rbac-no-metrics": {
        "rbac": {"create": False},
        "admissionPolicy": {"enabled": False},
        "serviceAccount": {"create": False, "name": "existing-operator"},
        "metrics": {"enabled": False},
        "fullnameOverride": "pdx",
    },
}
INVALID_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "zero replicas": ({"replicaCount": 0}, "/replicaCount"),
    "unknown top-level key": ({"replicas": 2}, "replicas"),
    "unknown log format": ({"operator": {"logFormat": "xml"}}, "/operator/logFormat"),
    "port out of range": ({"metrics": {"port": 70000}}, "/metrics/port"),
    "malformed digest tag": ({"image": {"tag": "sha256:nothex"}}, "/image/tag"),
    "namespace that is no DNS label": ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
}


def run_helm(cases: dict[str, dict[str, Any]], tmp: Path, chart: Path = CHART) -> dict[str, Any]:
    """Install each case of values with the real Helm library (helm_check.py in .venv-helm)."""
    if not HELM_PYTHON.exists():
        pytest.skip("no .venv-helm: run `bash scripts/setup-helm-env.sh` (Python 3.12 + helm-sdkpy) first")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp),
        "XDG_CACHE_HOME": str(tmp / "cache"),
        "XDG_CONFIG_HOME": str(tmp / "config"),
        "XDG_DATA_HOME": str(tmp / "data"),
        "HELM_DRIVER": "memory",  # release records stay in the process, not in Secrets
    }
    payload = {"cases": {name: {"values": values, "namespace": NAMESPACE} for name, values in cases.items()}}
    proc = subprocess.run(
        [str(HELM_PYTHON), str(HELM_CHECK), str(chart)],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cases = {**VALID_CASES, **{f"invalid: {k}": v for k, (v, _) in INVALID_CASES.items()}}
    return run_helm(cases, tmp_path_factory.mktemp("helm-home"))


def _case(helm: dict[str, Any], name: str) -> dict[str, Any]:
    case: dict[str, Any] = helm["cases"][name]
    return case


def _sent(helm: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The objects Helm created at the API server (CRDs included)."""
    return [o["object"] for o in _case(helm, name)["install"]["objects"]]


def _rendered(helm: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The release manifest Helm recorded (templates only, no CRDs)."""
    return [d for d in yaml.safe_load_all(_case(helm, name)["install"]["manifest"]) if d]


def _one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def _kinds(objs: list[dict[str, Any]]) -> set[str]:
    return {o["kind"] for o in objs}


def _container(helm: dict[str, Any], name: str) -> dict[str, Any]:
    pod = _one(_rendered(helm, name), "Deployment")["spec"]["template"]["spec"]
    container: dict[str, Any] = pod["containers"][0]
    return container


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_helm_is_the_real_v4_library(helm: dict[str, Any]) -> None:
    assert helm["helm"].startswith("helm-sdkpy-v")


@pytest.mark.parametrize("name", list(VALID_CASES))
def test_lint_finds_no_errors_or_warnings(helm: dict[str, Any], name: str) -> None:
    lint = _case(helm, name)["lint"]
    bad = [m for m in lint["messages"] if m["severity"] in ("WARNING", "ERROR")]
    assert bad == [], bad


@pytest.mark.parametrize("name", list(VALID_CASES))
def test_install_succeeds_and_the_api_receives_exactly_the_manifest_and_crds(helm: dict[str, Any], name: str) -> None:
    install = _case(helm, name)["install"]
    assert install["ok"], install["error"]
    sent = {(o["kind"], o["metadata"]["name"]) for o in _sent(helm, name)}
    rendered = {(o["kind"], o["metadata"]["name"]) for o in _rendered(helm, name)}
    crds = {("CustomResourceDefinition", d["metadata"]["name"]) for d in _chart_crds()}
    assert sent == rendered | crds


@pytest.mark.parametrize("name", list(VALID_CASES))
def test_every_builtin_object_is_valid_for_kubernetes_1_37_strictly(helm: dict[str, Any], name: str) -> None:
    custom = {"DisaggregatedInference", "ClusterKopfPeering", "KopfPeering"}
    checked: set[str] = set()
    for obj in _sent(helm, name):
        if obj["kind"] in custom:
            continue
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        checked.add(obj["kind"])
    assert {"Deployment", "CustomResourceDefinition"} <= checked


@pytest.mark.parametrize("name", list(VALID_CASES))
def test_custom_objects_are_valid_for_their_crds(helm: dict[str, Any], name: str) -> None:
    crds = {(d["spec"]["group"], d["spec"]["names"]["kind"]): d for d in _chart_crds()}
    for obj in _sent(helm, name):
        group = obj["apiVersion"].split("/")[0]
        crd = crds.get((group, obj["kind"]))
        if crd is None:
            continue
        version = next(v for v in crd["spec"]["versions"] if obj["apiVersion"].endswith("/" + v["name"]))
        jsonschema.Draft7Validator(version["schema"]["openAPIV3Schema"]).validate(obj)
        if obj["kind"] == "DisaggregatedInference":
            # The API server's view (structural defaults, strict fields, CEL) and the models'.
            assert api_server_errors(obj["spec"]) == []
            parse_spec(obj["spec"])


def _chart_crds() -> list[dict[str, Any]]:
    return [d for p in sorted((CHART / "crds").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def test_the_crds_helm_creates_are_the_chart_copies_of_the_sources(helm: dict[str, Any]) -> None:
    sent = {o["metadata"]["name"]: o for o in _sent(helm, "defaults") if o["kind"] == "CustomResourceDefinition"}
    source = yaml.safe_load(sync_chart.CRD_SOURCE.read_text())
    got = sent[source["metadata"]["name"]]
    assert {k: got[k] for k in ("apiVersion", "kind", "spec")} == {k: source[k] for k in ("apiVersion", "kind", "spec")}


def test_operator_pod_meets_the_restricted_pod_security_standard(helm: dict[str, Any]) -> None:
    pod = _one(_rendered(helm, "defaults"), "Deployment")["spec"]["template"]["spec"]
    psc, (container,) = pod["securityContext"], pod["containers"]
    sc = container["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 65532
    assert psc["seccompProfile"]["type"] == "RuntimeDefault"
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
    assert sc["readOnlyRootFilesystem"] is True
    assert not any("hostPath" in v for v in pod["volumes"])
    assert not pod.get("hostNetwork") and not pod.get("hostPID")


def test_probes_hit_kopfs_liveness_endpoint_on_the_port_it_listens_on(helm: dict[str, Any]) -> None:
    container = _container(helm, "defaults")
    liveness = next(a for a in container["args"] if a.startswith("--liveness="))
    port = int(liveness.rsplit(":", 1)[1].split("/")[0])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == port and liveness.endswith("/healthz")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["command"] == ["kopf", "run"]
    assert "--module=pdx.controller.handlers" in container["args"]
    assert "--all-namespaces" in container["args"]
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_single_replica_runs_standalone_and_is_recreated_not_overlapped(helm: dict[str, Any]) -> None:
    objs = _rendered(helm, "defaults")
    assert "--standalone" in _container(helm, "defaults")["args"]
    assert _one(objs, "Deployment")["spec"]["strategy"]["type"] == "Recreate"
    assert not _kinds(objs) & {"PodDisruptionBudget", "ClusterKopfPeering"}


def test_two_replicas_peer_through_the_operators_peering_object(helm: dict[str, Any]) -> None:
    """The peering object's name is the one the handlers join (pdx.controller.rbac.PEERING_NAME)."""
    name = "ha-sample-custom-image"
    objs, container = _rendered(helm, name), _container(helm, name)
    assert "--standalone" not in container["args"]
    assert _env(container)["PDX_PEERING_MANDATORY"] == "1"
    assert _one(objs, "ClusterKopfPeering")["metadata"]["name"] == "pdx-operator"
    assert _one(objs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    deployment = _one(objs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert "--priority=200" in container["args"] and "--verbose" in container["args"]


def test_custom_image_digest_and_pull_secrets_are_used(helm: dict[str, Any]) -> None:
    name = "ha-sample-custom-image"
    pod = _one(_rendered(helm, name), "Deployment")["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == f"registry.example.internal/ml/pdx-operator@{DIGEST}"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert _container(helm, "defaults")["image"] == "ghcr.io/pdx-dev/pdx-operator:0.1.0"


def test_sample_is_installed_only_when_asked_in_its_namespace(helm: dict[str, Any]) -> None:
    sample = _one(_rendered(helm, "ha-sample-custom-image"), "DisaggregatedInference")
    assert sample["metadata"]["namespace"] == "inference"
    assert sample["spec"]["kvTransfer"]["bidirectional"] is True
    assert "DisaggregatedInference" not in _kinds(_rendered(helm, "defaults"))


def test_cluster_role_grants_exactly_the_operators_rules_to_its_service_account(helm: dict[str, Any]) -> None:
    objs = _rendered(helm, "defaults")
    role, binding = _one(objs, "ClusterRole"), _one(objs, "ClusterRoleBinding")
    from pdx.controller import rbac

    assert role["rules"] == rbac.rbac_rules()
    sa = _one(objs, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}]
    pod = _one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]


def test_rbac_and_metrics_can_be_left_out(helm: dict[str, Any]) -> None:
    name = "no-rbac-no-metrics"
    objs = _rendered(helm, name)
    assert not _kinds(objs) & {"ClusterRole", "ClusterRoleBinding", "ServiceAccount", "Service", "Role", "RoleBinding"}
    assert not _kinds(objs) & {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    container = _container(helm, name)
    assert [p["name"] for p in container["ports"]] == ["health"]
    assert "PDX_METRICS_PORT" not in _env(container)
    pod = _one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "existing-operator"
    assert _one(objs, "Deployment")["metadata"]["name"] == "pdx"


def test_metrics_port_is_exposed_and_served_by_a_service(helm: dict[str, Any]) -> None:
    objs = _rendered(helm, "defaults")
    container = _container(helm, "defaults")
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    assert _env(container)["PDX_METRICS_PORT"] == "9090"
    service = _one(objs, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    deployment = _one(objs, "Deployment")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_notes_tell_how_to_check_the_rollout(helm: dict[str, Any]) -> None:
    notes = _case(helm, "defaults")["install"]["notes"]
    assert f"kubectl -n {NAMESPACE} rollout status deployment/pdx-pdx-operator" in notes
    assert "standalone" in notes
    ha_notes = _case(helm, "ha-sample-custom-image")["install"]["notes"]
    assert "2 replicas" in ha_notes and "get dinf qwen3-32b" in ha_notes


@pytest.mark.parametrize(("what", "field"), [(k, f) for k, (_, f) in INVALID_CASES.items()])
def test_invalid_values_fail_lint_and_install_naming_the_field(helm: dict[str, Any], what: str, field: str) -> None:
    case = _case(helm, f"invalid: {what}")
    assert case["lint"]["errors"] > 0
    assert not case["install"]["ok"]
    assert "schema" in case["install"]["error"] and field in case["install"]["error"]
    assert not [o for o in case["install"]["objects"] if o["object"]["kind"] != "CustomResourceDefinition"]


WRITES = {"create", "update", "patch", "delete", "deletecollection", "*"}
CHILD_RESOURCES = {(k.group, k.plural) for k in kinds.CHILDREN}


def _grants(rule: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def test_with_watched_namespaces_no_cluster_rule_grants_writes_to_child_kinds(helm: dict[str, Any]) -> None:
    objs = _rendered(helm, "watched-namespaces")
    cluster = {grant for rule in _one(objs, "ClusterRole")["rules"] for grant in _grants(rule)}
    assert not {(g, r, v) for g, r, v in cluster if v in WRITES}, "the ClusterRole writes"
    assert not {(g, r) for g, r, _ in cluster} & (CHILD_RESOURCES | {("", "pods"), ("inference.pdx.dev", "*")})
    roles = {o["metadata"]["namespace"]: o for o in objs if o["kind"] == "Role"}
    bindings = {o["metadata"]["namespace"]: o for o in objs if o["kind"] == "RoleBinding"}
    assert set(roles) == set(bindings) == {"inference", "research"}
    sa = _one(objs, "ServiceAccount")["metadata"]["name"]
    for ns, role in roles.items():
        assert role["rules"] == rbac.namespaced_rules()
        assert bindings[ns]["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }
        assert bindings[ns]["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
    # Every right the operator's handlers need is still granted somewhere.
    granted = cluster | {grant for rule in rbac.namespaced_rules() for grant in _grants(rule)}
    assert {grant for rule in rbac.rbac_rules() for grant in _grants(rule)} - granted == {
        ("kopf.dev", "clusterkopfpeerings", v) for v in ("list", "watch", "patch", "get")
    }


def test_with_watched_namespaces_the_operator_serves_and_peers_in_exactly_them(helm: dict[str, Any]) -> None:
    name = "watched-namespaces"
    args = _container(helm, name)["args"]
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=inference", "--namespace=research"]
    objs = _rendered(helm, name)
    peerings = {o["metadata"]["namespace"]: o["metadata"]["name"] for o in objs if o["kind"] == "KopfPeering"}
    assert peerings == {"inference": rbac.PEERING_NAME, "research": rbac.PEERING_NAME}
    assert "ClusterKopfPeering" not in _kinds(objs)


def _chart_policy(helm: dict[str, Any], name: str) -> tuple[dict[str, Any], str]:
    objs = _rendered(helm, name)
    policy, binding = _one(objs, "ValidatingAdmissionPolicy"), _one(objs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    sa = _one(objs, "ServiceAccount")["metadata"]["name"]
    return policy, admission.service_account_user(NAMESPACE, sa)


def _child(kind: str) -> dict[str, Any]:
    doc = {
        "apiVersion": "inference.pdx.dev/v1alpha1",
        "kind": "DisaggregatedInference",
        "metadata": {"name": "demo", "namespace": "inference", "uid": "0d2c3b3e-1111-2222-3333-444455556666"},
        "spec": {"model": {"name": "Qwen/Qwen3-32B"}},
    }
    return next(o for o in render(load(doc)) if o["kind"] == kind)


def test_with_all_namespaces_the_admission_policy_denies_the_operator_foreign_objects(helm: dict[str, Any]) -> None:
    policy, operator = _chart_policy(helm, "defaults")
    assert policy["spec"]["failurePolicy"] == "Fail"
    aws_auth = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "aws-auth", "namespace": "kube-system"}}
    mine = _child("ConfigMap")
    for operation in ("CREATE", "UPDATE", "DELETE"):

        def ask(obj: dict[str, Any], user: str = operator, op: str = operation) -> Any:
            return review(policy, user=user, operation=op, api_version="v1", resource="configmaps",
                          namespace=obj["metadata"]["namespace"], obj=None if op == "DELETE" else obj,
                          old=None if op == "CREATE" else obj)  # fmt: skip

        assert not ask(aws_auth).allowed
        assert ask(mine).allowed
        assert not ask(aws_auth, user="kubernetes-admin").matched


def test_the_admission_policy_is_the_operators_own_definition(helm: dict[str, Any]) -> None:
    policy, operator = _chart_policy(helm, "watched-namespaces")
    expected = admission.policy(operator)["spec"]
    assert policy["spec"] == expected


def test_the_operator_pods_carry_the_labels_the_routers_default_operator_peer_admits(helm: dict[str, Any]) -> None:
    pod_labels = _one(_rendered(helm, "defaults"), "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert labels.operator_pods().items() <= pod_labels.items()
