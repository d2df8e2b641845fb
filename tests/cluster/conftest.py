"""One real Kubernetes 1.36 control plane per test session: etcd, kube-apiserver (RBAC on),
kube-controller-manager, kube-scheduler and kwok, from scripts/build-control-plane.sh (tens of
minutes on a cold Go cache, seconds after), with two p5en.48xlarge kwok nodes and one CPU node.

A machine that cannot build or start it fails these tests; PDX_SKIP_CONTROL_PLANE=1 skips them
instead, with the reason in pytest's summary.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator

import pytest

from tests.support.control_plane import BuildError, ControlPlane, build, cpu_node, p5en_node, wait_for

GPU_NODES = ("p5en-0", "p5en-1")
CPU_NODES = ("cpu-0",)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    if os.environ.get("PDX_SKIP_CONTROL_PLANE") == "1":
        pytest.skip("PDX_SKIP_CONTROL_PLANE=1: the tests against a real Kubernetes control plane are skipped")
    try:
        bin_dir = build()
    except BuildError as err:
        pytest.fail(f"no Kubernetes control plane on this machine (PDX_SKIP_CONTROL_PLANE=1 skips these tests): {err}")
    with ControlPlane(bin_dir) as cp:
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
