"""The operator's own code against the real control plane of ``tests.support.control_plane``:
its API client (``Kube``) logged in through a kubeconfig, reconcile passes called as the
handlers call them, and the whole kopf operator in this process (as tests/operator runs it
against kmock), so a test may patch its module state and read it.

The operator logs in as a user of ``audited_kubeconfig``: the API server's audit log then lists
every request it sent (``ControlPlane.audit``), where kmock's request log did before.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from pdx import kinds, labels
from pdx.controller.kube import Kube
from pdx.controller.reconcile import Outcome, reconcile
from pdx.render.router import ENDPOINTS_FILE
from pdx.spec import API_VERSION, KIND, PLURAL
from tests.support.control_plane import ControlPlane, wait_for

__all__ = ["OPERATOR_USER", "Cluster", "InProcessOperator", "cr_document", "kube_for"]

OPERATOR_USER = "pdx-operator-under-test"
MODEL = "Qwen/Qwen3-32B"


def kube_for(kubeconfig: Path) -> Kube:
    """The operator's API client, logged in through ``kubeconfig`` (certificates or token)."""
    conf = k8s_client.Configuration()
    k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=conf)  # type: ignore[no-untyped-call]
    return Kube(k8s_client.ApiClient(conf))


def cr_document(name: str, namespace: str, ttl: int = 480, **spec: Any) -> dict[str, Any]:
    """tests/operator's resource: 2P2D of Qwen3-32B on p5en (one GPU per engine)."""
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": MODEL},
            "prefill": {"replicas": 2},
            "decode": {"replicas": 2},
            "kvTransfer": {"decoderKvBlocksTtlSeconds": ttl},
        },
    }
    body["spec"].update(spec)
    return body


def expected_children(name: str) -> set[tuple[str, str]]:
    """What a 2P2D resource owns (kind, name)."""
    return {
        *{(kind, f"{name}-{role}") for kind in ("Service", "StatefulSet") for role in ("prefill", "decode")},
        ("ConfigMap", f"{name}-router"), ("ConfigMap", f"{name}-endpoints"),
        ("Deployment", f"{name}-router"), ("Service", f"{name}-router"),
        *{("NetworkPolicy", f"{name}-{role}") for role in ("prefill", "decode", "router")},
        ("PodDisruptionBudget", f"{name}-prefill"), ("PodDisruptionBudget", f"{name}-decode"),
    }  # fmt: skip


class Cluster:
    """Reads and writes of one namespace as the cluster's admin, through the operator's own
    client (a kubectl process per read is ~0.2 s of a 2-core machine)."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.cp = cp
        self.ns = namespace
        self.kube = kube_for(cp.admin_kubeconfig)

    def where(self, api: str = "v1") -> str:
        """The namespace's path for API group/version ``api``."""
        return f"{'/api' if '/' not in api else '/apis'}/{api}/namespaces/{self.ns}"

    def get(self, what: str, api: str = "v1") -> dict[str, Any]:
        """GET ``<namespace path>/<what>`` (``pods``, ``resourcequotas/NAME``), any kind."""
        out: dict[str, Any] = self.kube.call("GET", f"{self.where(api)}/{what}")
        return out

    def create(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self.kube.call("POST", f"/apis/{API_VERSION}/namespaces/{self.ns}/{PLURAL}", body=doc)
        return out

    def patch(self, kind: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        api_version = API_VERSION if kind == KIND else _kind(kind).api_version
        path = _path(api_version, kind, self.ns, name)
        out: dict[str, Any] = self.kube.call("PATCH", path, body=patch, content_type="application/merge-patch+json")
        return out

    def delete(self, kind: str, name: str) -> None:
        api_version = API_VERSION if kind == KIND else "v1" if kind == "Pod" else _kind(kind).api_version
        self.kube.delete(api_version, kind, self.ns, name)

    def live(self, kind: str, name: str) -> dict[str, Any] | None:
        if kind == KIND:
            return self.kube.get_resource(self.ns, name)
        api_version = "v1" if kind == "Pod" else _kind(kind).api_version
        return self.kube.get(api_version, kind, self.ns, name)

    def status(self, name: str) -> dict[str, Any]:
        status: dict[str, Any] = (self.live(KIND, name) or {}).get("status") or {}
        return status

    def conditions(self, name: str) -> dict[str, dict[str, Any]]:
        return {c["type"]: c for c in self.status(name).get("conditions", [])}

    def children(self, name: str) -> dict[tuple[str, str], dict[str, Any]]:
        """The resource's live children, by (kind, name)."""
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for kind in kinds.CHILDREN:
            for obj in self.kube.list(kind.api_version, kind.kind, self.ns, {labels.INSTANCE: name}):
                found[(obj["kind"], obj["metadata"]["name"])] = obj
        return found

    def pods(self, name: str, role: str | None = None) -> list[dict[str, Any]]:
        selector = {labels.INSTANCE: name, **({labels.COMPONENT: role} if role else {})}
        return self.kube.list("v1", "Pod", self.ns, selector)

    def sts_hash(self, name: str, role: str) -> str:
        sts = self.live("StatefulSet", f"{name}-{role}")
        assert sts is not None
        h: str = sts["spec"]["template"]["metadata"]["labels"][labels.CONFIG_HASH]
        return h

    def published(self, name: str) -> list[dict[str, Any]]:
        cm = self.live("ConfigMap", f"{name}-endpoints")
        if cm is None:
            return []
        eps: list[dict[str, Any]] = json.loads((cm.get("data") or {}).get(ENDPOINTS_FILE) or "{}").get("endpoints", [])
        return eps

    def generations(self, name: str) -> set[str]:
        return {e["generation"] for e in self.published(name)}

    def versions(self, name: str) -> dict[tuple[str, str], str]:
        """resourceVersion of the resource and each child."""
        out = {k: c["metadata"]["resourceVersion"] for k, c in self.children(name).items()}
        body = self.live(KIND, name)
        if body is not None:
            out[(KIND, name)] = body["metadata"]["resourceVersion"]
        return out

    def ready_pods(self, name: str, role: str, count: int, config_hash: str | None = None) -> bool:
        got = [
            p for p in self.pods(name, role)
            if not p["metadata"].get("deletionTimestamp") and _ready(p)
            and (config_hash is None or p["metadata"]["labels"].get(labels.CONFIG_HASH) == config_hash)
        ]  # fmt: skip
        return len(got) == count

    def settled(self, name: str, prefill: int = 2, decode: int = 2, timeout: float = 60.0) -> None:
        """Every pod of the resource Running and Ready (the real controllers and kwok), none leaving."""
        wait_for(
            f"{name}'s pods Ready",
            lambda: all(
                self.ready_pods(name, role, n) and len(self.pods(name, role)) == n  # none leaving
                for role, n in (("prefill", prefill), ("decode", decode), ("router", 1))
            ),
            timeout,
        )

    def run(self, name: str, kube: Kube, **kw: Any) -> Outcome:
        out = reconcile(kube, self.ns, name, **kw)
        assert out is not None
        return out


def _kind(kind: str) -> kinds.Kind:
    (found,) = [k for k in kinds.CHILDREN if k.kind == kind]
    return found


def _path(api_version: str, kind: str, namespace: str, name: str) -> str:
    from pdx.controller.kube import path_of

    return path_of(api_version, kind, namespace, name)


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
    )


class InProcessOperator:
    """``kopf run --standalone --namespace NS -m pdx.controller.handlers`` in a thread of this
    process (its own event loop, as in production its own process), logged in through
    ``kubeconfig``. Confined to the test's namespace, so other tests' resources are not its."""

    def __init__(self, kubeconfig: Path, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.monkeypatch = monkeypatch
        self._runners: list[Any] = []

    def start(self, stats: Callable[[str], Any] | None = None) -> None:
        from kopf.testing import KopfRunner

        import pdx.controller.handlers as handlers

        mp = self.monkeypatch
        mp.setenv("KUBECONFIG", str(self.kubeconfig))
        mp.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        # The client reads $KUBECONFIG once, at import; point its default there too.
        mp.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(self.kubeconfig))
        mp.setattr(handlers, "RESYNC_SECONDS", 0.5)  # the timer, as tests/operator runs it
        mp.setattr(handlers, "fetch_router_stats", stats or (lambda url: None))
        runner = KopfRunner(
            ["run", "--standalone", "--namespace", self.namespace, "-m", "pdx.controller.handlers"], timeout=60
        )
        runner.__enter__()
        self._runners.append(runner)
        wait_for("the operator's worker", lambda: handlers._worker is not None, timeout=60, every=0.1)

    def stop(self) -> None:
        while self._runners:
            runner = self._runners.pop()
            runner.__exit__(None, None, None)
            assert runner.exit_code == 0, runner.output

    @contextlib.contextmanager
    def running(self, stats: Callable[[str], Any] | None = None) -> Iterator[InProcessOperator]:
        self.start(stats)
        try:
            yield self
        finally:
            self.stop()


def quiet_for(cp: ControlPlane, user: str, seconds: float) -> list[str]:
    """The requests ``user`` sent during the next ``seconds``, as 'VERB URI'."""
    mark = cp.audit_mark()
    time.sleep(seconds)
    time.sleep(0.3)  # the last ones' audit lines
    return [f"{e['verb']} {e['requestURI']}" for e in cp.audit(user, mark)]
