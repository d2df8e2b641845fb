"""`ControlPlane(workload_controllers=False)`: etcd and the real API server, nothing acting on
what is stored; the operator benchmark's leg without the controllers' load
(scripts/bench_operator_cluster.py --workload-controllers off)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.control_plane import ControlPlane

pytestmark = pytest.mark.cluster


def test_without_workload_controllers_a_deployment_is_stored_and_nothing_acts_on_it(control_plane_bin: Path) -> None:
    with ControlPlane(control_plane_bin, workload_controllers=False) as cp:
        assert set(cp.pids) == {"etcd", "kube-apiserver"}
        cp.kubectl("create", "namespace", "bench")
        labels = {"app": "web"}
        cp.apply({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "bench"},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "pause"}]},
            }},
        })  # fmt: skip
        time.sleep(3)  # with the controllers, a ReplicaSet and the namespace's ServiceAccount come within it
        assert cp.get("deployment", "web", "-n", "bench")["metadata"]["name"] == "web"
        assert cp.get("replicasets", "-n", "bench")["items"] == []
        assert cp.get("serviceaccounts", "-n", "bench")["items"] == []
