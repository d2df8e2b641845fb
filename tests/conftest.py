"""The session's one real Kubernetes 1.36 control plane, for every directory that needs it
(tests/cluster, tests/images): etcd, kube-apiserver (RBAC on), kube-controller-manager,
kube-scheduler and kwok, from scripts/build-control-plane.sh (tens of minutes on a cold Go cache,
seconds after), with two p5en.48xlarge kwok nodes and one CPU node. Here, not in one directory's
conftest: a session fixture defined in two conftests is two fixtures, two control planes.

A machine that cannot build or start it fails these tests; PDX_SKIP_CONTROL_PLANE=1 skips them
instead, with the reason in pytest's summary.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.control_plane import BuildError, ControlPlane, build, cpu_node, p5en_node, wait_for

if TYPE_CHECKING:  # the operator's client, imported where a test asks for `cluster`
    from tests.support.operator_cluster import Cluster

ROOT = Path(__file__).parents[1]
CRD = "disaggregatedinferences.inference.pdx.dev"

GPU_NODES = ("p5en-0", "p5en-1")
CPU_NODES = ("cpu-0",)


@pytest.fixture(scope="session")
def control_plane_bin() -> Path:
    """The control plane's programs, built if need be (skipped or failed as above)."""
    if os.environ.get("PDX_SKIP_CONTROL_PLANE") == "1":
        pytest.skip("PDX_SKIP_CONTROL_PLANE=1: the tests against a real Kubernetes control plane are skipped")
    try:
        return build()
    except BuildError as err:
        pytest.fail(f"no Kubernetes control plane on this machine (PDX_SKIP_CONTROL_PLANE=1 skips these tests): {err}")


@pytest.fixture(scope="session")
def control_plane(control_plane_bin: Path) -> Iterator[ControlPlane]:
    with ControlPlane(control_plane_bin) as cp:
        cp.add_nodes(*(p5en_node(n) for n in GPU_NODES), *(cpu_node(n) for n in CPU_NODES))
        yield cp


@pytest.fixture
def namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    """A Namespace of its own per test, with its `default` ServiceAccount made by the real
    ServiceAccount controller (pods are refused until it exists); deleted afterwards."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{slug}-{hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:8]}"
    control_plane.kubectl("create", "namespace", name)
    wait_for(
        f"ServiceAccount {name}/default",
        lambda: control_plane.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
        timeout=30,
    )
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def pdx_crd(control_plane: ControlPlane) -> str:
    """pdx's CRD (crds/, what the chart's crds/ holds too), Established. `helm install` later
    finds it there and leaves it, as Helm does with every CRD that exists."""
    control_plane.kubectl("apply", "--server-side", "-f", str(ROOT / "crds" / "disaggregatedinferences.yaml"))
    # Polled, not `kubectl wait`: once in CI (2026-12-07) that wait failed and every cluster test
    # errored with it; a poll outlasts a slow or a not-yet-listed CRD, and its timeout says so.
    established = "jsonpath={.status.conditions[?(@.type=='Established')].status}"
    wait_for(
        f"CRD {CRD} Established",
        lambda: control_plane.kubectl("get", "crd", CRD, "-o", established, check=False).stdout.strip() == "True",
        timeout=120,
        every=0.5,
    )
    return CRD


@pytest.fixture
def cluster(control_plane: ControlPlane, pdx_crd: str, namespace: str) -> Iterator[Cluster]:
    """The test's namespace as the admin sees it. Afterwards the namespace is deleted and its
    pods waited for (the namespace controller's work, not the garbage collector's, which finds
    a new CRD's owners only at its next discovery), so they free the p5en nodes' GPUs for the
    next test and the user flow's 8-GPU engines."""
    from pdx.controller.kube import ApiError
    from tests.support.operator_cluster import Cluster

    c = Cluster(control_plane, namespace)
    yield c
    # Nothing makes pods again (orphaned, the controllers' pods are nobody's), then the pods
    # go at once: kwok removes a pod deleted with no grace as soon as it sees it.
    for plural in ("statefulsets", "deployments", "replicasets"):
        for obj in c.get(plural, api="apps/v1")["items"]:
            with contextlib.suppress(ApiError):
                c.kube.call("DELETE", f"{c.where('apps/v1')}/{plural}/{obj['metadata']['name']}",
                            body={"propagationPolicy": "Orphan"})  # fmt: skip
    for pod in c.get("pods")["items"]:
        with contextlib.suppress(ApiError):
            c.kube.call("DELETE", f"{c.where()}/pods/{pod['metadata']['name']}", body={"gracePeriodSeconds": 0})
    control_plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    wait_for(
        f"the pods of {namespace} gone",
        lambda: c.kube.list("v1", "Pod", namespace, {}) == [],
        timeout=60,
    )
