"""The control plane is real: Kubernetes' own scheduler, StatefulSet, ReplicaSet/Deployment and
garbage-collector controllers act on what is applied, kwok plays the kubelet, and RBAC decides.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest

from tests.conftest import CPU_NODES, GPU_NODES
from tests.support.control_plane import KWOK_NOT_READY, KWOK_STOP_AT_GRACE, ControlPlane, wait_for

pytestmark = pytest.mark.cluster

PAUSE = "registry.k8s.io/pause:3.10"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def statefulset(name: str, namespace: str, replicas: int, pod_spec: dict[str, Any]) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def gpu_pod_spec(gpus: int) -> dict[str, Any]:
    """What pdx renders for an engine on p5en, reduced to placement: selector, toleration, limits."""
    return {
        "nodeSelector": {"node.kubernetes.io/instance-type": "p5en.48xlarge"},
        "tolerations": [GPU_TOLERATION],
        "containers": [
            {
                "name": "engine",
                "image": PAUSE,
                "resources": {"limits": {"nvidia.com/gpu": str(gpus), "vpc.amazonaws.com/efa": "2"}},
            }
        ],
    }


def pods(cp: ControlPlane, namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cp.get("pods", "-n", namespace, "-l", selector)["items"]
    return items


def ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status", {})
    conditions = status.get("conditions", [])
    return status.get("phase") == "Running" and any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def wait_ready_pods(cp: ControlPlane, namespace: str, selector: str, count: int) -> list[dict[str, Any]]:
    def check() -> list[dict[str, Any]] | None:
        got = pods(cp, namespace, selector)
        return got if len(got) == count and all(ready(p) for p in got) else None

    return wait_for(f"{count} Ready pods {selector} in {namespace}", check, timeout=60)


def test_statefulset_pods_are_scheduled_onto_gpu_nodes_and_become_ready(
    control_plane: ControlPlane, namespace: str
) -> None:
    cp = control_plane
    cp.apply(statefulset("decode", namespace, 2, gpu_pod_spec(gpus=4)))

    got = wait_ready_pods(cp, namespace, "app=decode", 2)

    assert sorted(p["metadata"]["name"] for p in got) == ["decode-0", "decode-1"]
    for pod in got:
        assert pod["spec"]["nodeName"] in GPU_NODES  # the scheduler's binding, by selector and toleration
        assert pod["status"]["podIP"]  # kwok's, as a kubelet reports it
        (owner,) = pod["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("StatefulSet", "decode", True)
    status = wait_for(
        "StatefulSet status readyReplicas=2",
        lambda: (s := cp.get("statefulset", "decode", "-n", namespace)["status"]).get("readyReplicas") == 2 and s,
    )
    assert status["currentRevision"] == status["updateRevision"]


def test_scheduler_keeps_untolerating_pods_off_gpu_nodes(control_plane: ControlPlane, namespace: str) -> None:
    cp = control_plane
    spec = {"containers": [{"name": "router", "image": PAUSE, "resources": {"requests": {"cpu": "100m"}}}]}
    cp.apply(statefulset("router", namespace, 3, spec))

    got = wait_ready_pods(cp, namespace, "app=router", 3)

    assert {p["spec"]["nodeName"] for p in got} <= set(CPU_NODES)  # the GPU taint keeps them off p5en


def test_scheduler_leaves_a_pod_pending_when_no_node_has_the_gpus(control_plane: ControlPlane, namespace: str) -> None:
    cp = control_plane
    cp.apply(statefulset("too-big", namespace, 1, gpu_pod_spec(gpus=16)))

    def failed_scheduling() -> str | None:
        events = cp.get("events", "-n", namespace, "--field-selector", "reason=FailedScheduling")["items"]
        messages = [e["message"] for e in events if e["involvedObject"]["name"] == "too-big-0"]
        return messages[0] if messages else None

    message = wait_for("a FailedScheduling event for too-big-0", failed_scheduling, timeout=60)
    assert "Insufficient nvidia.com/gpu" in message
    (pod,) = pods(cp, namespace, "app=too-big")
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")


def test_deleting_a_statefulset_lets_the_garbage_collector_remove_its_pods(
    control_plane: ControlPlane, namespace: str
) -> None:
    cp = control_plane
    cp.apply(statefulset("prefill", namespace, 2, gpu_pod_spec(gpus=1)))
    wait_ready_pods(cp, namespace, "app=prefill", 2)
    revisions = cp.get("controllerrevisions", "-n", namespace)["items"]
    assert revisions and all(r["metadata"]["ownerReferences"][0]["name"] == "prefill" for r in revisions)

    # Background propagation: the API server removes the StatefulSet at once; the garbage
    # collector then deletes its dependents, and kwok finishes each pod's deletion.
    cp.kubectl("delete", "statefulset", "prefill", "-n", namespace, "--cascade=background", "--wait=false")

    wait_for("the StatefulSet's pods gone", lambda: pods(cp, namespace, "app=prefill") == [], timeout=60)
    wait_for(
        "the StatefulSet's ControllerRevisions gone",
        lambda: cp.get("controllerrevisions", "-n", namespace)["items"] == [],
        timeout=60,
    )


def test_orphaning_a_statefulset_keeps_its_pods_without_owner(control_plane: ControlPlane, namespace: str) -> None:
    cp = control_plane
    cp.apply(statefulset("kept", namespace, 1, gpu_pod_spec(gpus=1)))
    wait_ready_pods(cp, namespace, "app=kept", 1)

    cp.kubectl("delete", "statefulset", "kept", "-n", namespace, "--cascade=orphan")

    def orphaned() -> dict[str, Any] | None:
        (pod,) = pods(cp, namespace, "app=kept")
        return None if pod["metadata"].get("ownerReferences") else pod

    pod = wait_for("the pod's ownerReference dropped by the garbage collector", orphaned, timeout=60)
    assert ready(pod)


def test_deployment_rolls_out_a_new_replicaset_when_its_template_changes(
    control_plane: ControlPlane, namespace: str
) -> None:
    cp = control_plane
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "router", "namespace": namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "router"}},
            "template": {
                "metadata": {"labels": {"app": "router"}, "annotations": {"pdx/config-hash": "one"}},
                "spec": {"containers": [{"name": "router", "image": PAUSE}]},
            },
        },
    }
    cp.apply(deployment)
    cp.kubectl("rollout", "status", "deployment/router", "-n", namespace, "--timeout=60s", timeout=90)
    first = {rs["metadata"]["name"] for rs in cp.get("replicasets", "-n", namespace)["items"]}
    assert len(first) == 1

    deployment["spec"]["template"]["metadata"]["annotations"]["pdx/config-hash"] = "two"
    cp.apply(deployment)
    cp.kubectl("rollout", "status", "deployment/router", "-n", namespace, "--timeout=60s", timeout=90)

    replicasets = {rs["metadata"]["name"]: rs for rs in cp.get("replicasets", "-n", namespace)["items"]}
    (new,) = set(replicasets) - first
    assert replicasets[new]["status"].get("readyReplicas") == 2
    wait_for(
        "the old ReplicaSet scaled to 0",
        lambda: all(cp.get("replicaset", name, "-n", namespace)["status"]["replicas"] == 0 for name in first),
    )
    running = wait_ready_pods(cp, namespace, "app=router", 2)
    assert {p["metadata"]["annotations"]["pdx/config-hash"] for p in running} == {"two"}


def test_rbac_denies_a_user_until_a_role_binding_grants_access(control_plane: ControlPlane, namespace: str) -> None:
    cp = control_plane
    alice = cp.user_kubeconfig("alice", ["pdx-testers"])

    with pytest.raises(subprocess.CalledProcessError) as denied:
        cp.kubectl("get", "pods", "-n", namespace, kubeconfig=alice)
    assert "(Forbidden)" in denied.value.stderr
    assert 'User "alice" cannot list resource "pods"' in denied.value.stderr

    cp.kubectl("create", "role", "pod-reader", "--verb=get,list,watch", "--resource=pods", "-n", namespace)
    cp.kubectl("create", "rolebinding", "testers", "--role=pod-reader", "--group=pdx-testers", "-n", namespace)

    wait_for(
        "alice may list pods",
        lambda: cp.kubectl("get", "pods", "-n", namespace, kubeconfig=alice, check=False).returncode == 0,
        timeout=30,
    )
    still = cp.kubectl("get", "secrets", "-n", namespace, kubeconfig=alice, check=False)
    assert still.returncode != 0 and "(Forbidden)" in still.stderr
    elsewhere = cp.kubectl("get", "pods", "-n", "kube-system", kubeconfig=alice, check=False)
    assert elsewhere.returncode != 0 and "(Forbidden)" in elsewhere.stderr


def test_a_service_account_token_carries_only_its_roles(control_plane: ControlPlane, namespace: str) -> None:
    cp = control_plane
    cp.kubectl("create", "serviceaccount", "operator", "-n", namespace)
    cp.kubectl("create", "role", "cm-editor", "--verb=get,list,create", "--resource=configmaps", "-n", namespace)
    cp.kubectl(
        "create", "rolebinding", "operator", "--role=cm-editor", f"--serviceaccount={namespace}:operator",
        "-n", namespace,
    )  # fmt: skip
    operator = cp.service_account_kubeconfig(namespace, "operator")

    who = cp.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}", kubeconfig=operator)
    assert who.stdout == f"system:serviceaccount:{namespace}:operator"
    cp.kubectl("create", "configmap", "made-by-sa", "-n", namespace, kubeconfig=operator)
    assert cp.get("configmap", "made-by-sa", "-n", namespace)["metadata"]["name"] == "made-by-sa"
    denied = cp.kubectl("create", "secret", "generic", "nope", "-n", namespace, kubeconfig=operator, check=False)
    assert denied.returncode != 0
    assert f'User "system:serviceaccount:{namespace}:operator" cannot create resource "secrets"' in denied.stderr


def test_nodes_stay_ready_on_their_kwok_leases(control_plane: ControlPlane) -> None:
    cp = control_plane
    leases = {lease["metadata"]["name"] for lease in cp.get("leases", "-n", "kube-node-lease")["items"]}
    assert set(GPU_NODES) | set(CPU_NODES) <= leases
    for node in cp.get("nodes")["items"]:
        conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert conditions["Ready"] == "True", node["metadata"]["name"]
        assert not [t for t in node["spec"].get("taints", []) if t["key"].startswith("node.kubernetes.io/")]
    gpu = cp.get("node", GPU_NODES[0])
    assert gpu["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert gpu["status"]["allocatable"]["vpc.amazonaws.com/efa"] == "16"
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in gpu["spec"]["taints"]


# --- pdx's kwok stages (scripts/control-plane/kwok-stages.yaml) ----------------------------------


def _pod(name: str, namespace: str, annotations: dict[str, str], grace: int = 30) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "staged"}, "annotations": annotations},
        "spec": {
            "terminationGracePeriodSeconds": grace,
            "containers": [{"name": "engine", "image": PAUSE}],
        },
    }


def _condition(pod: dict[str, Any], kind: str) -> str | None:
    found = [c["status"] for c in pod.get("status", {}).get("conditions", []) if c["type"] == kind]
    return found[0] if found else None


def _annotate(cp: ControlPlane, namespace: str, pod: str, key: str, value: str | None) -> None:
    patch = {"metadata": {"annotations": {key: value}}}
    cp.kubectl("patch", "pod", pod, "-n", namespace, "--type=merge", "-p", json.dumps(patch))


def _gone(cp: ControlPlane, namespace: str, pod: str) -> bool:
    return cp.kubectl("get", "pod", pod, "-n", namespace, check=False).returncode != 0


def test_a_pod_annotated_not_ready_runs_unready_while_its_peer_goes_ready_and_follows_the_annotation(
    control_plane: ControlPlane, namespace: str
) -> None:
    """A failing readiness probe, on demand: held out of Ready from the start, Ready once the
    annotation goes, and out of Ready again when it comes back."""
    cp = control_plane
    key, value = KWOK_NOT_READY
    cp.apply(_pod("held", namespace, {key: value}), _pod("peer", namespace, {}))
    wait_for("the peer Ready", lambda: ready(cp.get("pod", "peer", "-n", namespace)))

    held = wait_for(
        "held Running, Ready False",
        lambda: (
            (p := cp.get("pod", "held", "-n", namespace))["status"].get("phase") == "Running"
            and _condition(p, "Ready") == "False"
            and p
        ),
    )
    assert held["status"]["podIP"] and held["spec"]["nodeName"]  # started, with an address: unready only
    assert [c["ready"] for c in held["status"]["containerStatuses"]] == [False]
    assert ready(cp.get("pod", "peer", "-n", namespace))
    time.sleep(2)  # kwok had its chance to make it Ready, and did not
    assert _condition(cp.get("pod", "held", "-n", namespace), "Ready") == "False"

    _annotate(cp, namespace, "held", key, None)
    wait_ready_pods(cp, namespace, "app=staged", 2)
    _annotate(cp, namespace, "held", key, value)
    wait_for("held out of Ready again", lambda: _condition(cp.get("pod", "held", "-n", namespace), "Ready") == "False")
    assert ready(cp.get("pod", "peer", "-n", namespace))


def test_a_pod_that_asks_for_its_grace_period_stays_terminating_until_it_ends(
    control_plane: ControlPlane, namespace: str
) -> None:
    """A preStop drain that uses its whole grace period: the pod stays (Running, with its
    deletionTimestamp) until then; a pod without the annotation goes at once, as before."""
    cp = control_plane
    grace = 12
    key, value = KWOK_STOP_AT_GRACE
    cp.apply(_pod("draining", namespace, {key: value}, grace), _pod("quick", namespace, {}, grace))
    wait_ready_pods(cp, namespace, "app=staged", 2)

    deleted_at = time.monotonic()
    cp.kubectl("delete", "pod", "draining", "quick", "-n", namespace, "--wait=false")
    wait_for("quick gone", lambda: _gone(cp, namespace, "quick"), timeout=grace - 2, every=0.5)
    pod = cp.get("pod", "draining", "-n", namespace)
    assert time.monotonic() - deleted_at < grace  # still within its grace period
    assert pod["metadata"]["deletionTimestamp"] and pod["metadata"]["deletionGracePeriodSeconds"] == grace
    assert ready(pod)  # its containers run until they stop

    wait_for("draining gone", lambda: _gone(cp, namespace, "draining"), timeout=60, every=0.5)
    assert time.monotonic() - deleted_at >= grace - 1  # deletionTimestamp has whole seconds


def test_a_finalizer_holds_a_pod_past_its_grace_period(control_plane: ControlPlane, namespace: str) -> None:
    cp = control_plane
    key, value = KWOK_STOP_AT_GRACE
    held = _pod("held", namespace, {key: value}, grace=1)
    held["metadata"]["finalizers"] = ["pdx.test/drain-in-progress"]
    cp.apply(held)
    wait_ready_pods(cp, namespace, "app=staged", 1)

    cp.kubectl("delete", "pod", "held", "-n", namespace, "--wait=false")
    time.sleep(4)  # the grace period is long over
    assert cp.get("pod", "held", "-n", namespace)["metadata"]["deletionTimestamp"]

    cp.kubectl("patch", "pod", "held", "-n", namespace, "--type=json",
               "-p", '[{"op":"remove","path":"/metadata/finalizers"}]')  # fmt: skip
    wait_for("held gone once the finalizer is removed", lambda: _gone(cp, namespace, "held"), timeout=30)
