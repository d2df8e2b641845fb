"""pdx as a user runs it, against Kubernetes' own API server, controllers and scheduler.

`helm install` of charts/pdx-operator (the `helm` command, built from helm.sh/helm/v4); the
operator its Deployment declares, run as a local process with the chart's ServiceAccount
token (kwok runs no container); `kubectl apply -f examples/seed-qwen3-32b-1p1d.yaml`, a
`kubectl patch` of the TTL, bad resources, HPA/PDB/NetworkPolicy/PodMonitor, an operator
restart, two peered replicas, a decode scale-down, deletion, and `helm uninstall`. The tests
run in file order and share one release and one resource: each step is a user's next command.
docs/control-plane.md has the table of what each step shows.
"""

from __future__ import annotations

import copy
import functools
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdx import labels
from pdx.controller import admission
from pdx.render.router import ENDPOINTS_FILE
from pdx_contract.endpoints import EndpointsDocument
from tests.apiserver.test_rejections import DOCS, TABLE, document
from tests.conftest import CPU_NODES, GPU_NODES
from tests.support.control_plane import ControlPlane, p5en_node, wait_for
from tests.support.pdx_cluster import ROOT, Helm, ObjectWatch, Operator

pytestmark = pytest.mark.cluster

CHART = ROOT / "charts" / "pdx-operator"
RELEASE = "pdx-operator"  # the chart's full name is then the release's: pdx-operator
CHART_NS = "pdx-system"
EXAMPLE = ROOT / "examples" / "seed-qwen3-32b-1p1d.yaml"
AUTOSCALED = ROOT / "examples" / "qwen3-32b-autoscaled.yaml"
NAME = "qwen3-32b"
NS = "inference"  # the examples' namespace
CRD = "disaggregatedinferences.inference.pdx.dev"
SETTLE_SECONDS = 120.0
# What the seed's DisaggregatedInference owns, by kubectl resource name.
CHILD_RESOURCES = (
    "statefulsets",
    "services",
    "deployments",
    "configmaps",
    "networkpolicies",
    "poddisruptionbudgets",
    "horizontalpodautoscalers",
    "podmonitors",
)


@dataclass(frozen=True)
class Release:
    """What `helm install` made: the rendered objects (templates; crds/ aside) and its Deployment."""

    manifest: list[dict[str, Any]]
    deployment: dict[str, Any]
    service_account: str


def _instance(name: str = NAME) -> str:
    return f"{labels.INSTANCE}={name},{labels.NAME}={labels.APP}"


def _ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status", {})
    return status.get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
    )


def _pods(cp: ControlPlane, selector: str, namespace: str = NS) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cp.get("pods", "-n", namespace, "-l", selector)["items"]
    return items


def _role_pods(cp: ControlPlane, role: str, name: str = NAME) -> list[dict[str, Any]]:
    return _pods(cp, f"{_instance(name)},{labels.COMPONENT}={role}")


def _endpoints(cm: dict[str, Any]) -> EndpointsDocument:
    return EndpointsDocument.model_validate_json((cm.get("data") or {}).get(ENDPOINTS_FILE) or "{}")


def _template_hash(sts: dict[str, Any]) -> str:
    hash_: str = sts["spec"]["template"]["metadata"]["labels"][labels.CONFIG_HASH]
    return hash_


def _rolled_out(sts: dict[str, Any]) -> bool:
    status, replicas = sts.get("status", {}), sts["spec"].get("replicas", 1)
    return bool(
        status.get("observedGeneration") == sts["metadata"]["generation"]
        and status.get("updateRevision") == status.get("currentRevision")
        and status.get("updatedReplicas", 0) == replicas
        and status.get("readyReplicas", 0) == replicas
    )


# --- fixtures: the user's commands, once per module ------------------------------------------


@pytest.fixture(scope="module")
def helm(control_plane: ControlPlane) -> Helm:
    return Helm(control_plane)


@pytest.fixture(scope="module")
def prometheus_crds(control_plane: ControlPlane) -> list[str]:
    """The Prometheus Operator's published CRDs, as a cluster with it installed has them."""
    names = []
    for path in sorted((control_plane.bin_dir.parent / "share" / "prometheus-operator").glob("*.yaml")):
        control_plane.kubectl("apply", "--server-side", "-f", str(path))
        names.append(yaml.safe_load(path.read_text())["metadata"]["name"])
    for name in names:
        control_plane.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s", timeout=90)
    return names


@pytest.fixture(scope="module")
def release(control_plane: ControlPlane, helm: Helm, prometheus_crds: list[str]) -> Iterator[Release]:
    """`helm install pdx-operator charts/pdx-operator -n pdx-system --create-namespace`."""
    helm("install", RELEASE, str(CHART), "-n", CHART_NS, "--create-namespace")
    manifest = [d for d in yaml.safe_load_all(helm("get", "manifest", RELEASE, "-n", CHART_NS).stdout) if d]
    (sa,) = [d["metadata"]["name"] for d in manifest if d["kind"] == "ServiceAccount"]
    deployment = control_plane.get("deployment", RELEASE, "-n", CHART_NS)
    yield Release(manifest, deployment, sa)
    if helm("status", RELEASE, "-n", CHART_NS, check=False).returncode == 0:
        helm("uninstall", RELEASE, "-n", CHART_NS, check=False)


@pytest.fixture(scope="module")
def operator_kubeconfig(control_plane: ControlPlane, release: Release) -> Path:
    """A kubeconfig with a token of the chart's ServiceAccount (`kubectl create token`), nothing else."""
    return control_plane.service_account_kubeconfig(CHART_NS, release.service_account)


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane, release: Release, operator_kubeconfig: Path) -> Iterator[Operator]:
    op = Operator.from_deployment(control_plane, release.deployment, operator_kubeconfig).start()
    yield op
    op.stop()


@pytest.fixture(scope="module")
def user_namespace(control_plane: ControlPlane, release: Release) -> Iterator[str]:
    """The examples' namespace with what they name and a user provides: the model cache PVC
    (bound to a PersistentVolume: there is no provisioner) and the Hugging Face token Secret."""
    cp = control_plane
    cp.kubectl("create", "namespace", NS)
    wait_for(
        f"ServiceAccount {NS}/default",
        lambda: cp.kubectl("get", "serviceaccount", "default", "-n", NS, check=False).returncode == 0,
        timeout=30,
    )
    cp.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": "hf-cache"},
            "spec": {
                "capacity": {"storage": "1Ti"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": "/mnt/hf-cache"},
                "claimRef": {"namespace": NS, "name": "hf-cache"},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "hf-cache", "namespace": NS},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": "hf-cache",
                "resources": {"requests": {"storage": "1Ti"}},
            },
        },
    )
    cp.kubectl("create", "secret", "generic", "hf-token", "-n", NS, "--from-literal=token=hf_not_a_real_token")
    wait_for(
        "PVC hf-cache Bound (the real PersistentVolume controller)",
        lambda: cp.get("pvc", "hf-cache", "-n", NS)["status"].get("phase") == "Bound",
        timeout=60,
    )
    yield NS
    cp.kubectl("delete", "namespace", NS, "--wait=false", check=False)
    cp.kubectl("delete", "pv", "hf-cache", "--wait=false", check=False)


@pytest.fixture(scope="module")
def seed(control_plane: ControlPlane, operator: Operator, user_namespace: str) -> dict[str, Any]:
    """`kubectl apply -f examples/seed-qwen3-32b-1p1d.yaml`; the resource as first created."""
    control_plane.kubectl("apply", "-f", str(EXAMPLE))
    resource: dict[str, Any] = control_plane.get("dinf", NAME, "-n", NS)
    return resource


@pytest.fixture(scope="module")
def rejections_namespace(control_plane: ControlPlane, release: Release) -> Iterator[str]:
    control_plane.kubectl("create", "namespace", "rejections")
    yield "rejections"
    control_plane.kubectl("delete", "namespace", "rejections", "--wait=false", check=False)


# --- the chart ---------------------------------------------------------------------------------


def test_helm_install_deploys_the_chart_and_its_operator_pod_is_scheduled_on_a_cpu_node(
    control_plane: ControlPlane, helm: Helm, release: Release
) -> None:
    cp = control_plane
    version = helm("version", "--template", "{{.Version}}").stdout
    assert version == "v4.3.2"
    status = json.loads(helm("status", RELEASE, "-n", CHART_NS, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    kinds = {d["kind"] for d in release.manifest}
    assert {
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    } <= kinds  # fmt: skip
    # The chart's crds/: the CRD is served (Established) before the templates were applied.
    conditions = {c["type"]: c["status"] for c in cp.get("crd", CRD)["status"]["conditions"]}
    assert conditions["Established"] == "True"
    # The Deployment's pod: scheduled by the real scheduler (no GPU toleration: the CPU node).
    selector = ",".join(f"{k}={v}" for k, v in release.deployment["spec"]["selector"]["matchLabels"].items())
    (pod,) = wait_for(
        "the operator Deployment's pod Ready",
        lambda: got if (got := _pods(cp, selector, CHART_NS)) and all(_ready(p) for p in got) else None,
        timeout=60,
    )
    assert pod["spec"]["nodeName"] in CPU_NODES
    assert pod["spec"]["serviceAccountName"] == release.service_account


def test_the_operator_runs_with_the_chart_service_account_and_its_rbac_only(
    control_plane: ControlPlane, release: Release, operator: Operator, operator_kubeconfig: Path
) -> None:
    cp = control_plane
    user = f"system:serviceaccount:{CHART_NS}:{release.service_account}"
    who = cp.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}", kubeconfig=operator_kubeconfig)
    assert who.stdout == user
    config = json.loads(operator_kubeconfig.read_text())
    assert set(config["users"][0]["user"]) == {"token"}  # no client certificate, no admin

    def can(*args: str) -> bool:
        result = cp.kubectl("auth", "can-i", *args, kubeconfig=operator_kubeconfig, check=False)
        return result.stdout.strip() == "yes"

    assert can("patch", "statefulsets.apps", "-n", NS)
    assert can("watch", "disaggregatedinferences.inference.pdx.dev", "--all-namespaces")
    assert not can("get", "secrets", "-n", NS)
    assert not can("delete", "nodes")
    assert not can("update", "disaggregatedinferences.inference.pdx.dev", "-n", NS)
    assert operator.running
    assert "listed " in operator.log(tail=100_000)


# --- the resource ------------------------------------------------------------------------------


def _children(cp: ControlPlane, name: str = NAME) -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for resource in CHILD_RESOURCES:
        for item in cp.get(resource, "-n", NS, "-l", _instance(name), "--show-managed-fields")["items"]:
            found[(item["kind"], item["metadata"]["name"])] = item
    return found


def test_applying_the_seed_example_creates_the_engines_the_services_and_the_router(
    control_plane: ControlPlane, seed: dict[str, Any]
) -> None:
    cp = control_plane
    expected = {
        ("StatefulSet", f"{NAME}-prefill"), ("StatefulSet", f"{NAME}-decode"),
        ("Service", f"{NAME}-prefill"), ("Service", f"{NAME}-decode"), ("Service", f"{NAME}-router"),
        ("Deployment", f"{NAME}-router"),
        ("ConfigMap", f"{NAME}-router"), ("ConfigMap", f"{NAME}-endpoints"),
        ("NetworkPolicy", f"{NAME}-prefill"), ("NetworkPolicy", f"{NAME}-decode"), ("NetworkPolicy", f"{NAME}-router"),
        ("PodDisruptionBudget", f"{NAME}-prefill"), ("PodDisruptionBudget", f"{NAME}-decode"),
    }  # fmt: skip
    children = wait_for("the seed's children", lambda: c if expected <= set(c := _children(cp)) else None, timeout=60)
    assert set(children) == expected
    for (kind, name), child in children.items():
        (owner,) = child["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "DisaggregatedInference", NAME, seed["metadata"]["uid"], True,
        ), (kind, name)  # fmt: skip
        # Written by server-side apply as the operator's field manager, not by anyone else.
        managers = {m["manager"] for m in child["metadata"]["managedFields"]}
        assert labels.MANAGER in managers, (kind, name, managers)
    services = {n: c for (k, n), c in children.items() if k == "Service"}
    assert all(s["spec"].get("clusterIP") for s in services.values())  # allocated by the API server


def test_the_real_scheduler_places_each_engine_on_its_own_p5en_node_and_the_router_on_the_cpu_node(
    control_plane: ControlPlane, seed: dict[str, Any]
) -> None:
    cp = control_plane

    def placed() -> dict[str, dict[str, Any]] | None:
        pods = {p["metadata"]["name"]: p for p in _pods(cp, _instance())}
        return pods if len(pods) == 3 and all(_ready(p) for p in pods.values()) else None

    pods = wait_for("prefill, decode and router pods Ready", placed, timeout=SETTLE_SECONDS)
    prefill, decode = pods[f"{NAME}-prefill-0"], pods[f"{NAME}-decode-0"]
    (router,) = [p for n, p in pods.items() if n.startswith(f"{NAME}-router-")]
    # 8 GPUs each: one engine fills a p5en.48xlarge, so the two land on different nodes.
    assert {prefill["spec"]["nodeName"], decode["spec"]["nodeName"]} == set(GPU_NODES)
    assert router["spec"]["nodeName"] in CPU_NODES
    for engine in (prefill, decode):
        limits = engine["spec"]["containers"][0]["resources"]["limits"]
        assert (limits["nvidia.com/gpu"], limits["vpc.amazonaws.com/efa"]) == ("8", "16")
        assert engine["metadata"]["labels"][labels.CONFIG_HASH]
        assert engine["status"]["podIP"]


def test_kubectl_get_dinf_shows_ready_and_every_column(control_plane: ControlPlane, seed: dict[str, Any]) -> None:
    cp = control_plane

    def row() -> dict[str, str] | None:
        header, *lines = cp.kubectl("get", "dinf", NAME, "-n", NS).stdout.splitlines()
        got = dict(zip(header.split(), lines[0].split(), strict=True))
        return got if got["READY"] == "True" else None

    got = wait_for("kubectl get dinf: READY True", row, timeout=SETTLE_SECONDS)
    assert (got["NAME"], got["PREFILL"], got["DECODE"]) == (NAME, "1/1", "1/1")
    assert (got["BIDIRECTIONAL"], got["TTL"], got["THRESHOLD"]) == ("true", "480", "64")
    assert got["AGE"] != "<unknown>"
    wide = cp.kubectl("get", "dinf", NAME, "-n", NS, "-o", "wide").stdout.splitlines()[0].split()
    assert wide[-3:] == ["HIT-RATE", "RELEASED", "AGE"]  # priority-1 columns, shown with -o wide
    status = cp.get("dinf", NAME, "-n", NS)["status"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "True", conditions["Ready"]


def test_a_converged_resource_is_left_alone_by_the_operator(
    control_plane: ControlPlane, seed: dict[str, Any], operator: Operator
) -> None:
    """No pass "repairs" what the API server stored differently from what was sent (found here:
    a Service's `publishNotReadyAddresses: false`, which the server leaves out, was re-applied
    and reported as a hand edit on every pass)."""
    cp = control_plane
    wait_for("kubectl get dinf: READY True", lambda: cp.get("dinf", NAME, "-n", NS)["status"].get("ready") == "True")
    versions = {k: c["metadata"]["resourceVersion"] for k, c in _children(cp).items()}
    time.sleep(3)  # the passes the pods' and sets' last status changes trigger
    assert {k: c["metadata"]["resourceVersion"] for k, c in _children(cp).items()} == versions
    events = cp.get("events", "-n", NS, "--field-selector", f"involvedObject.name={NAME}")["items"]
    reasons = {e["reason"] for e in events}
    assert "Applied" in reasons
    assert "DriftRepaired" not in reasons, [e["message"] for e in events if e["reason"] == "DriftRepaired"]
    assert "(repaired)" not in operator.log(tail=10**7)


# --- bad resources -------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(TABLE))
def test_kubectl_apply_of_a_bad_resource_is_refused_with_the_documented_message(
    control_plane: ControlPlane, rejections_namespace: str, case: str
) -> None:
    row = TABLE[case]
    name, spec = DOCS[case]
    doc = document(name, rejections_namespace, copy.deepcopy(spec))

    refused = control_plane.kubectl("apply", "-f", "-", input=json.dumps(doc), check=False)

    assert refused.returncode != 0
    for field, message in (row.server, *row.more):
        assert (f"{field}: {message}" if field else message) in refused.stderr, refused.stderr
    assert control_plane.get("dinf", "-n", rejections_namespace)["items"] == []


def test_the_admission_policy_refuses_the_operator_a_write_that_is_not_pdxs(
    control_plane: ControlPlane, operator_kubeconfig: Path, user_namespace: str
) -> None:
    cp = control_plane
    # RBAC allows it (the ClusterRole writes ConfigMaps anywhere); the chart's policy does not.
    stray = cp.kubectl("create", "configmap", "stray", "-n", NS, kubeconfig=operator_kubeconfig, check=False)
    assert stray.returncode != 0
    (labelled,) = [v["message"] for v in admission.validations() if "may write only objects labelled" in v["message"]]
    assert "ValidatingAdmissionPolicy 'pdx-operator-owned-objects'" in stray.stderr, stray.stderr
    assert labelled in stray.stderr
    system = cp.kubectl(
        "create", "configmap", "stray", "-n", "kube-system", kubeconfig=operator_kubeconfig, check=False
    )
    assert "the pdx operator never writes in kube-system" in system.stderr, system.stderr
    cp.kubectl("create", "configmap", "stray", "-n", NS)  # another user is not matched
    cp.kubectl("delete", "configmap", "stray", "-n", NS)


# --- edits ---------------------------------------------------------------------------------------


def _patched_and_rolled(cp: ControlPlane, patch: dict[str, Any]) -> tuple[str, str]:
    """`kubectl patch` of the resource, then both StatefulSets rolled by the real controller to
    one new hash, their pods Ready on it and the endpoints file flipped: (old hash, new hash).
    Every version of the endpoints file seen meanwhile lists engines of one hash only, and once
    flipped it never goes back."""
    sets = (f"{NAME}-prefill", f"{NAME}-decode")
    wait_for("both StatefulSets rolled out", lambda: all(_rolled_out(cp.get("sts", s, "-n", NS)) for s in sets),
             timeout=SETTLE_SECONDS)  # fmt: skip
    (old,) = {_template_hash(cp.get("sts", s, "-n", NS)) for s in sets}
    wait_for(
        "the endpoints file lists the pair",
        lambda: len(_endpoints(cp.get("cm", f"{NAME}-endpoints", "-n", NS)).endpoints) == 2,
    )

    with ObjectWatch(cp, ["configmap", f"{NAME}-endpoints", "-n", NS]) as watch:
        cp.kubectl("patch", "dinf", NAME, "-n", NS, "--type=merge", "-p", json.dumps(patch))

        def rolled() -> str | None:
            got = [cp.get("sts", s, "-n", NS) for s in sets]
            hashes = {_template_hash(s) for s in got}
            if len(hashes) != 1 or old in hashes or not all(_rolled_out(s) for s in got):
                return None
            (new,) = hashes
            pods = _pods(cp, _instance())
            engines = [p for p in pods if labels.ROLE in p["metadata"]["labels"]]
            if len(engines) != 2 or {p["metadata"]["labels"][labels.CONFIG_HASH] for p in engines} != {new}:
                return None
            if not all(_ready(p) for p in engines):
                return None
            file = _endpoints(cp.get("cm", f"{NAME}-endpoints", "-n", NS))
            return (
                new if {(e.role, e.generation) for e in file.endpoints} == {("prefill", new), ("decode", new)} else None
            )

        new = wait_for("both StatefulSets on one new config hash, the file flipped", rolled, timeout=SETTLE_SECONDS)
        time.sleep(1)  # the watch's last events

    versions = [_endpoints(obj) for obj in watch.objects()]
    assert new != old
    seen = [{e.generation for e in v.endpoints} for v in versions]
    assert all(len(gens) <= 1 for gens in seen), seen  # never engines of two hashes in one file
    assert {old} in seen and {new} in seen  # the file was watched before and after the flip
    # Once flipped, never back.
    first_new = next(i for i, gens in enumerate(seen) if gens == {new})
    assert all(old not in gens for gens in seen[first_new:]), seen
    return old, new


def _kv_transfer_config(cp: ControlPlane, role: str) -> dict[str, Any]:
    """The `--kv-transfer-config` JSON the engine of `role` is started with."""
    sts = cp.get("sts", f"{NAME}-{role}", "-n", NS)
    container = sts["spec"]["template"]["spec"]["containers"][0]
    argv = [*container.get("command", []), *container.get("args", [])]
    flag = argv.index("--kv-transfer-config")
    config: dict[str, Any] = json.loads(argv[flag + 1])
    return config


def test_patching_the_ttl_rolls_both_statefulsets_to_one_new_hash_and_the_router_never_pairs_two(
    control_plane: ControlPlane, seed: dict[str, Any]
) -> None:
    cp = control_plane
    _patched_and_rolled(cp, {"spec": {"kvTransfer": {"decoderKvBlocksTtlSeconds": 600}}})
    # The real StatefulSet controller made a new ControllerRevision for each set.
    revisions = cp.get("controllerrevisions", "-n", NS, "-l", _instance())["items"]
    assert len(revisions) >= 4
    row = cp.kubectl("get", "dinf", NAME, "-n", NS, "-o", "jsonpath={.spec.kvTransfer.decoderKvBlocksTtlSeconds}")
    assert row.stdout == "600"


def test_switching_bidirectional_off_and_on_rolls_both_roles_each_time_and_back_to_the_same_hash(
    control_plane: ControlPlane, seed: dict[str, Any]
) -> None:
    cp = control_plane
    assert all(_kv_transfer_config(cp, role)["kv_connector_extra_config"]["bidirectional_kv_xfer"]
               for role in ("prefill", "decode"))  # fmt: skip
    on, off = _patched_and_rolled(cp, {"spec": {"kvTransfer": {"bidirectional": False}}})
    for role in ("prefill", "decode"):
        assert _kv_transfer_config(cp, role)["kv_connector_extra_config"]["bidirectional_kv_xfer"] is False
    assert cp.get("dinf", NAME, "-n", NS)["status"]["configHash"] == off
    back, on_again = _patched_and_rolled(cp, {"spec": {"kvTransfer": {"bidirectional": True}}})
    assert back == off
    assert on_again == on  # the hash is the configuration's: the same spec, the same engines
    for role in ("prefill", "decode"):
        assert _kv_transfer_config(cp, role)["kv_connector_extra_config"]["bidirectional_kv_xfer"] is True


# --- other kinds -----------------------------------------------------------------------------------


def test_hpa_pdb_networkpolicy_and_podmonitor_are_accepted_and_acted_on_by_the_real_controllers(
    control_plane: ControlPlane, seed: dict[str, Any], prometheus_crds: list[str]
) -> None:
    cp = control_plane
    assert "podmonitors.monitoring.coreos.com" in prometheus_crds
    doc = yaml.safe_load(AUTOSCALED.read_text())
    doc["spec"]["monitoring"] = {"podMonitors": True}
    name = doc["metadata"]["name"]
    cp.kubectl("apply", "-f", "-", input=json.dumps(doc))
    try:
        kinds = {"HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy", "PodMonitor"}

        def accepted() -> dict[tuple[str, str], dict[str, Any]] | None:
            got = _children(cp, name)
            return got if kinds <= {kind for kind, _ in got} else None

        children = wait_for(
            "the autoscaled resource's HPAs, PDBs, NetworkPolicies and PodMonitor", accepted, timeout=60
        )
        hpas = {n: c for (k, n), c in children.items() if k == "HorizontalPodAutoscaler"}
        assert set(hpas) == {f"{name}-prefill", f"{name}-decode"}
        for hpa_name, hpa in hpas.items():
            assert hpa["apiVersion"] == "autoscaling/v2"
            assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": hpa_name}

        # The real HPA controller reads them: no metrics API here, so it says it cannot scale.
        def hpa_conditions(hpa: str) -> dict[str, Any] | None:
            got = cp.get("hpa", hpa, "-n", NS)["status"].get("conditions", [])
            return {c["type"]: c for c in got} or None

        def pdb_status(pdb: str) -> dict[str, Any] | None:
            got: dict[str, Any] = cp.get("pdb", pdb, "-n", NS).get("status", {})
            return got if got.get("observedGeneration") else None

        for hpa_name in hpas:
            conditions = wait_for(
                f"HPA {hpa_name}'s conditions from the controller", functools.partial(hpa_conditions, hpa_name)
            )
            assert conditions["AbleToScale"]["status"] == "True", conditions
            assert conditions["ScalingActive"]["status"] == "False", conditions
        # The real disruption controller computes each PDB's status from the pods it selects.
        for (kind, pdb_name), _ in children.items():
            if kind == "PodDisruptionBudget":
                status = wait_for(f"PDB {pdb_name} observed", functools.partial(pdb_status, pdb_name))
                assert "expectedPods" in status and "disruptionsAllowed" in status
        (monitor,) = [c for (k, _), c in children.items() if k == "PodMonitor"]
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["spec"]["podMetricsEndpoints"]
        policies = [c for (k, _), c in children.items() if k == "NetworkPolicy"]
        assert all(p["spec"]["podSelector"] for p in policies)
    finally:
        cp.kubectl("delete", "dinf", name, "-n", NS, "--wait=false")
        wait_for(f"{name}'s children collected", lambda: not _children(cp, name) and not _pods(cp, _instance(name)),
                 timeout=SETTLE_SECONDS)  # fmt: skip


# --- the operator's own life -------------------------------------------------------------------


def _reconciled(op: Operator, name: str = NAME) -> int:
    """How many passes of ``name`` the operator's log reports."""
    return op.log(tail=10**8).count(f"reconciled {NS}/{name}:")


def _ready_on_new_hash(cp: ControlPlane, old: str) -> str | None:
    sets = [cp.get("sts", f"{NAME}-{role}", "-n", NS) for role in ("prefill", "decode")]
    hashes = {_template_hash(s) for s in sets}
    if len(hashes) != 1 or old in hashes or not all(_rolled_out(s) for s in sets):
        return None
    return hashes.pop() if cp.get("dinf", NAME, "-n", NS)["status"].get("ready") == "True" else None


def test_a_restarted_operator_restores_what_was_deleted_while_it_was_down(
    control_plane: ControlPlane, seed: dict[str, Any], operator: Operator
) -> None:
    cp = control_plane
    router = f"{NAME}-router"
    before = cp.get("deployment", router, "-n", NS)["metadata"]["uid"]
    assert operator.stop() == 0  # kopf's graceful stop on SIGTERM

    cp.kubectl("delete", "deployment", router, "-n", NS)
    time.sleep(2)
    assert cp.kubectl("get", "deployment", router, "-n", NS, check=False).returncode != 0  # nobody brings it back
    operator.start()

    def restored() -> str | None:
        got = cp.kubectl("get", "deployment", router, "-n", NS, "-o", "jsonpath={.metadata.uid}", check=False)
        return got.stdout if got.returncode == 0 and got.stdout else None

    assert wait_for("the router Deployment restored", restored, timeout=60) != before
    wait_for(
        "READY True again (the new router pod scheduled and Ready)",
        lambda: cp.get("dinf", NAME, "-n", NS)["status"].get("ready") == "True",
        timeout=SETTLE_SECONDS,
    )


def test_two_operator_replicas_elect_one_through_kopf_peering_and_the_standby_takes_over(
    control_plane: ControlPlane, helm: Helm, release: Release, seed: dict[str, Any], operator: Operator,
    operator_kubeconfig: Path,
) -> None:  # fmt: skip
    """`helm upgrade --set replicaCount=2`: the chart drops --standalone, makes peering mandatory
    and creates the ClusterKopfPeering; of two replicas only the higher priority works, and
    when it stops (a rollout's SIGTERM) the other resumes."""
    cp = control_plane
    helm("upgrade", RELEASE, str(CHART), "-n", CHART_NS, "--reuse-values", "--set", "replicaCount=2")
    deployment = cp.get("deployment", RELEASE, "-n", CHART_NS)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--standalone" not in args
    assert cp.get("clusterkopfpeering", "pdx-operator")["metadata"]["name"] == "pdx-operator"
    operator.stop()
    leader = Operator.from_deployment(cp, deployment, operator_kubeconfig, name="operator-leader")
    standby = Operator.from_deployment(cp, deployment, operator_kubeconfig, name="operator-standby")
    leader.env["PDX_OPERATOR_PRIORITY"], standby.env["PDX_OPERATOR_PRIORITY"] = "200", "100"
    assert leader.env["PDX_PEERING_MANDATORY"] == "1"
    try:
        leader.start()
        standby.start()
        # A peered replica starts paused; kopf resumes the one with the highest priority only.
        wait_for("the leader resuming", lambda: "Resuming operations" in leader.log(), timeout=30)
        peers = wait_for(
            "both replicas in the ClusterKopfPeering",
            lambda: s if len(s := cp.get("clusterkopfpeering", "pdx-operator").get("status") or {}) == 2 else None,
            timeout=30,
        )
        assert sorted(p["priority"] for p in peers.values()) == [100, 200]
        assert "Resuming operations" not in standby.log()

        old = _template_hash(cp.get("sts", f"{NAME}-decode", "-n", NS))
        passes = _reconciled(standby)
        cp.kubectl(
            "patch",
            "dinf",
            NAME,
            "-n",
            NS,
            "--type=merge",
            "-p",
            '{"spec":{"kvTransfer":{"kvRecomputeThreshold":128}}}',
        )
        middle = wait_for(
            "the threshold rolled out by the leader", lambda: _ready_on_new_hash(cp, old), timeout=SETTLE_SECONDS
        )
        assert _reconciled(standby) == passes  # the standby did nothing

        assert leader.stop() == 0
        wait_for("the standby resuming", lambda: "Resuming operations" in standby.log(), timeout=60)
        cp.kubectl(
            "patch", "dinf", NAME, "-n", NS, "--type=merge", "-p", '{"spec":{"kvTransfer":{"kvRecomputeThreshold":96}}}'
        )
        wait_for(
            "the threshold rolled out by the former standby",
            lambda: _ready_on_new_hash(cp, middle),
            timeout=SETTLE_SECONDS,
        )
        assert _reconciled(standby) > passes
    finally:
        leader.stop()
        standby.stop()
        helm("upgrade", RELEASE, str(CHART), "-n", CHART_NS, "--reuse-values", "--set", "replicaCount=1")
        operator.start()


def test_scaling_decode_down_lists_the_leaving_decode_as_draining_until_it_is_gone(
    control_plane: ControlPlane, seed: dict[str, Any], operator: Operator
) -> None:
    """The real StatefulSet controller deletes the highest ordinal; while that pod terminates
    (its preStop `pdx-drain` would run here: kwok runs no container, so a finalizer holds the
    pod as the drain's time would) the endpoints file lists it as draining, so the router
    decodes nothing new on it and moves its conversations' KV away; then it is dropped."""
    cp = control_plane
    cp.add_nodes(p5en_node("p5en-2"))  # room for a second 8-GPU decode
    decode_1 = f"{NAME}-decode-1"

    def published() -> dict[str, bool]:
        doc = _endpoints(cp.get("cm", f"{NAME}-endpoints", "-n", NS))
        return {e.name: e.draining for e in doc.endpoints if e.role == "decode"}

    try:
        cp.kubectl("patch", "dinf", NAME, "-n", NS, "--type=merge", "-p", '{"spec":{"decode":{"replicas":2}}}')
        wait_for(
            "two decodes published", lambda: published() == {f"{NAME}-decode-0": False, decode_1: False}, timeout=60
        )
        hold = {"metadata": {"finalizers": ["pdx.test/drain-in-progress"]}}
        cp.kubectl("patch", "pod", decode_1, "-n", NS, "--type=merge", "-p", json.dumps(hold))

        cp.kubectl("patch", "dinf", NAME, "-n", NS, "--type=merge", "-p", '{"spec":{"decode":{"replicas":1}}}')

        wait_for(
            "decode-1 published as draining",
            lambda: published() == {f"{NAME}-decode-0": False, decode_1: True},
            timeout=60,
        )
        pod = cp.get("pod", decode_1, "-n", NS)
        assert pod["metadata"]["deletionTimestamp"]  # the StatefulSet controller's scale-down
        # The drain's budget: the KV a decode holds lives at most the decoder TTL, and the pod is
        # given longer. (kwok's delete stage then force-deletes: deletionGracePeriodSeconds 0.)
        ttl = cp.get("dinf", NAME, "-n", NS)["spec"]["kvTransfer"]["decoderKvBlocksTtlSeconds"]
        assert pod["spec"]["terminationGracePeriodSeconds"] > ttl
        (pre_stop,) = [c["lifecycle"]["preStop"]["exec"]["command"] for c in pod["spec"]["containers"]]
        assert pre_stop[-1].endswith("pdx-drain")
        assert cp.get("dinf", NAME, "-n", NS)["status"]["decode"].get("draining") == 1

        cp.kubectl(
            "patch", "pod", decode_1, "-n", NS, "--type=json", "-p", '[{"op":"remove","path":"/metadata/finalizers"}]'
        )
        wait_for("decode-1 gone from the file", lambda: published() == {f"{NAME}-decode-0": False}, timeout=60)
        wait_for("decode-1 gone", lambda: cp.kubectl("get", "pod", decode_1, "-n", NS, check=False).returncode != 0)
    finally:
        cp.kubectl(
            "patch", "pod", decode_1, "-n", NS, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False
        )
        cp.kubectl("delete", "node", "p5en-2", "--wait=false", check=False)


# --- deletion ------------------------------------------------------------------------------------


def test_deleting_the_resource_lets_the_garbage_collector_remove_every_child(
    control_plane: ControlPlane, seed: dict[str, Any]
) -> None:
    cp = control_plane
    before = _children(cp)
    assert before
    assert _pods(cp, _instance())

    cp.kubectl("delete", "dinf", NAME, "-n", NS, "--wait=false")

    wait_for("every child collected", lambda: not _children(cp) and not _pods(cp, _instance()), timeout=SETTLE_SECONDS)
    assert cp.get("controllerrevisions", "-n", NS, "-l", _instance())["items"] == []
    assert cp.kubectl("get", "dinf", NAME, "-n", NS, check=False).returncode != 0


def test_helm_uninstall_leaves_nothing_of_the_chart(
    control_plane: ControlPlane, helm: Helm, release: Release, operator: Operator, operator_kubeconfig: Path
) -> None:
    cp = control_plane
    created = [(d["kind"], d["apiVersion"], d["metadata"].get("namespace"), d["metadata"]["name"])
               for d in release.manifest]  # fmt: skip
    namespaced = {kind for kind, _, ns, _ in created if ns}
    cluster_scoped = {kind for kind, _, ns, _ in created if not ns}
    assert {"ServiceAccount", "Deployment", "Service"} <= namespaced
    assert {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy"} <= cluster_scoped

    helm("uninstall", RELEASE, "-n", CHART_NS, "--wait", "--timeout=90s", timeout=120)

    def gone(kind: str, api_version: str, namespace: str | None, name: str) -> bool:
        resource = f"{kind.lower()}.{api_version.split('/')[0]}" if "/" in api_version else kind.lower()
        args = ["get", resource, name, "--ignore-not-found", "-o", "name"]
        return cp.kubectl(*args, *(["-n", namespace] if namespace else [])).stdout.strip() == ""

    for obj in created:
        wait_for(f"{obj} deleted", functools.partial(gone, *obj), timeout=60)
    # The Deployment's ReplicaSet and pod go with it (the garbage collector), and Helm's own
    # release records.
    wait_for("the operator's pods gone", lambda: cp.get("pods", "-n", CHART_NS)["items"] == [], timeout=60)
    assert cp.get("replicasets", "-n", CHART_NS)["items"] == []
    assert cp.get("secrets", "-n", CHART_NS, "-l", "owner=helm")["items"] == []
    assert helm("list", "-n", CHART_NS, "-q").stdout.strip() == ""

    # The ServiceAccount is gone, and with it every token of it: the operator is not even
    # authenticated any more (first it is only forbidden, while the SA outlives its binding).
    def unauthenticated() -> subprocess.CompletedProcess[str] | None:
        got = cp.kubectl("get", "ns", kubeconfig=operator_kubeconfig, check=False)
        return got if got.returncode != 0 and "Unauthorized" in got.stderr else None

    wait_for("the operator's token refused as Unauthorized", unauthenticated, timeout=30)
    # Helm never deletes what a chart's crds/ installed (its documented policy): the CRDs stay.
    assert (
        cp.kubectl("get", "crd", CRD, "-o", "name").stdout.strip()
        == f"customresourcedefinition.apiextensions.k8s.io/{CRD}"
    )
    operator.stop()
