"""`pdx bench --in-cluster`: the sweep as a Kubernetes Job next to the DisaggregatedInference.

In the cluster the benchmark reaches the router by its Service and the engines by pod IP (for
the NIXL metrics), which a laptop usually cannot. The Job runs the same `pdx bench --cluster`
command with a ServiceAccount allowed exactly what the cluster target does: read and patch
its one DisaggregatedInference, and list pods to find the engines.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

DEFAULT_IMAGE = "ghcr.io/pdx-dev/pdx-operator:0.1.0"  # ships the pdx distribution, pdx_bench included
RESULTS_DIR = "/results"


def job_objects(
    namespace: str,
    name: str,
    bench_args: Sequence[str],
    *,
    image: str = DEFAULT_IMAGE,
    deadline_s: int = 7200,
    results_claim: str | None = None,
) -> list[dict[str, Any]]:
    """ServiceAccount, Role, RoleBinding and Job; `bench_args` follow `pdx bench --cluster`.

    Results go to an emptyDir (the table and paths are in the pod's log) unless
    `results_claim` names a PersistentVolumeClaim to keep the records and plots.
    """
    app = f"pdx-bench-{name}"[:63].rstrip("-")
    labels = {
        "app.kubernetes.io/name": "pdx-bench",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/part-of": "pdx",
    }
    meta = {"name": app, "namespace": namespace, "labels": labels}
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": meta,
        "rules": [
            {
                "apiGroups": ["inference.pdx.dev"],
                "resources": ["disaggregatedinferences"],
                "resourceNames": [name],
                "verbs": ["get", "patch"],
            },
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": app},
        "subjects": [{"kind": "ServiceAccount", "name": app, "namespace": namespace}],
    }
    args = ["bench", "--cluster", "--namespace", namespace, "--name", name, "--out", RESULTS_DIR, *bench_args]
    container = {
        "name": "bench",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["pdx"],
        "args": args,
        "env": [
            {"name": "MPLCONFIGDIR", "value": "/tmp"},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ],
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "results", "mountPath": RESULTS_DIR}, {"name": "tmp", "mountPath": "/tmp"}],
    }
    results: dict[str, Any] = (
        {"name": "results", "persistentVolumeClaim": {"claimName": results_claim}}
        if results_claim
        else {"name": "results", "emptyDir": {}}
    )
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": 0,  # a rerun would flip the fleet again mid-way: fail visibly instead
            "activeDeadlineSeconds": deadline_s,
            "ttlSecondsAfterFinished": 86400,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": app,
                    "restartPolicy": "Never",
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [results, {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }
    # Separate copies: shared dicts would come out of yaml.safe_dump as anchors and aliases.
    out: list[dict[str, Any]] = json.loads(json.dumps([sa, role, binding, job]))
    return out
