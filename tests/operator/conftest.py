"""kmock as the API server, plus the few server behaviours the operator relies on.

`ApiServer` adds to kmock's emulator what a real API server does and the operator depends
on: server-side apply creates missing objects, new objects get a uid and a generation, and
spec edits bump the generation. Pods never appear by themselves (there is no StatefulSet
controller), so tests create them with `make_pods` to play the kubelet.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import jsonpointer
import kmock
import pytest
import yaml
from kubernetes import client as k8s_client

os.environ.setdefault("PDX_RESYNC_SECONDS", "0.5")  # before pdx.controller.handlers is imported

from pdx import kinds
from pdx.controller.kube import Kube
from pdx.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION

NS = "inference"
CR = kmock.resource(GROUP, VERSION, PLURAL)
PODS = kmock.resource("", "v1", "pods")
EVENTS = kmock.resource("", "v1", "events")
NAMESPACES = kmock.resource("", "v1", "namespaces")
CRDS = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
# The operator's child kinds, from its own table.
CHILD_RESOURCES = {k.kind: kmock.resource(k.group, k.version, k.plural) for k in kinds.CHILDREN}
STS = CHILD_RESOURCES["StatefulSet"]
WRITES = ("POST", "PATCH", "PUT", "DELETE")


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    version: int = 0  # resourceVersion: kopf tells its own patches' echoes by it
    # kmock matches every request against its whole request history (cost grows with it);
    # long runs (the benchmark) keep only the last `history` requests.
    history: int | None = None

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.history:
            self._requests = collections.deque(maxlen=self.history)  # type: ignore[assignment]

    async def _handle(self, request: kmock.Request) -> Any:
        if request.resource is not None and isinstance(request.data, list) and request.action == kmock.action.UPDATE:
            # kopf's JSON patches: a failed `test` (someone wrote since) is 422, as on a real
            # server, so kopf re-reads instead of retrying; then the version moves on.
            key = (request.resource, request.namespace, request.name or "")
            if key in self.objects and not self.objects[key].deleted:
                current = self.objects[key].raw
                for op in request.data:
                    if op.get("op") == "test" and jsonpointer.resolve_pointer(current, op["path"], None) != op["value"]:
                        raise kmock.KubernetesError(status=422, reason="Invalid", message=f"test failed: {op}")
            request.data.append({"op": "add", "path": "/metadata/resourceVersion", "value": self._next_version()})
        if request.resource is not None and isinstance(request.data, dict):
            key = (request.resource, request.namespace, request.name or "")
            exists = key in self.objects and not self.objects[key].deleted
            if request.action == kmock.action.UPDATE and exists:
                request.data.setdefault("metadata", {})["resourceVersion"] = self._next_version()
            if request.action == kmock.action.UPDATE and not request.subresource:
                if "apply-patch" in request.headers.get("Content-Type", "") and not exists:
                    # Server-side apply creates: kmock handles the request as the creation it
                    # is (one ADDED event, as from a real API server), not as a creation and
                    # then a patch of the new object with its own body (a copy of it, a second
                    # version, a MODIFIED event with the same object).
                    _stamp_new(request.data, key[1], self._next_version())
                    object.__setattr__(request, "action", kmock.action.CREATE)  # frozen attrs
                    return await super()._handle(request)
                elif exists and "spec" in request.data and request.data["spec"] != self.objects[key].get("spec"):
                    gen = (self.objects[key].get("metadata") or {}).get("generation") or 1
                    request.data.setdefault("metadata", {})["generation"] = gen + 1
            if request.action == kmock.action.CREATE:
                _stamp_new(request.data, request.namespace, self._next_version())
        return await super()._handle(request)

    async def _serve_list(self, request: kmock.Request) -> Any:
        """Lists honour equality label selectors, as a real API server does: kmock answers
        every object of the kind, which at hundreds of resources makes each of the
        operator's lists megabytes of JSON and the benchmark measure that instead."""
        answer = await super()._serve_list(request)
        terms = [t for t in (request.params.get("labelSelector") or "").split(",") if t]
        if any("!" in t or t.count("=") != 1 for t in terms):
            return answer  # not an equality selector: the operator filters again anyway
        wanted = dict(t.split("=", 1) for t in terms)
        if wanted and isinstance(answer, dict):
            answer["items"] = [
                item
                for item in answer["items"]
                if all(((item.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in wanted.items())
            ]
        return answer

    def _next_version(self) -> str:
        self.version += 1
        return str(self.version)


def _stamp_new(data: dict[str, Any], namespace: str | None, version: str) -> None:
    meta = data.setdefault("metadata", {})
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
    meta.setdefault("uid", str(uuid.uuid4()))
    meta.setdefault("generation", 1)
    meta["resourceVersion"] = version
    meta.setdefault("creationTimestamp", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    if namespace and not meta.get("namespace"):
        meta["namespace"] = namespace


def declare(server: kmock.KubernetesEmulator) -> None:
    """Discovery for everything the operator and kopf touch."""
    server.resources[CR] = kmock.ResourceInfo(
        kind=KIND, singular="disaggregatedinference", namespaced=True, subresources=["status"],
        verbs=["get", "list", "watch", "patch", "create", "delete"],
    )  # fmt: skip
    for kind, res in {**CHILD_RESOURCES, "Pod": PODS, "Event": EVENTS}.items():
        server.resources[res] = kmock.ResourceInfo(
            kind=kind, namespaced=True, verbs=["get", "list", "watch", "patch", "create", "delete"]
        )
    # kopf waits for these two to exist in discovery before it starts any watch.
    server.resources[NAMESPACES] = kmock.ResourceInfo(kind="Namespace", namespaced=False, verbs=["list", "watch"])
    server.resources[CRDS] = kmock.ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False, verbs=["list", "watch"]
    )


@pytest.fixture
def kmock_options() -> dict[str, Any]:
    return {"cls": ApiServer}


@pytest.fixture
def api(kmock: ApiServer) -> ApiServer:
    declare(kmock)
    return kmock


@pytest.fixture
def kube(api: ApiServer) -> Kube:
    conf = k8s_client.Configuration(host=str(api.url).rstrip("/"))
    return Kube(k8s_client.ApiClient(conf))


@pytest.fixture
def kubeconfig(api: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """So kopf logs in exactly as in production (kubeconfig), but to kmock."""
    path = tmp_path / "kubeconfig"
    server = str(api.url).rstrip("/")
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kmock", "cluster": {"server": server}}],
                "users": [{"name": "kmock", "user": {"token": "test"}}],
                "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}],
                "current-context": "kmock",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(path))
    # The client reads $KUBECONFIG once, at import; point its default there too.
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    yield path


def cr_document(name: str = "demo", ttl: int = 480, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "model": {"name": "Qwen/Qwen3-32B"},
            "prefill": {"replicas": 2},
            "decode": {"replicas": 2},
            "kvTransfer": {"decoderKvBlocksTtlSeconds": ttl},
        },
    }
    body["spec"].update(spec)
    return body


async def create_cr(api: ApiServer, doc: dict[str, Any]) -> dict[str, Any]:
    resp = await api.post(f"/apis/{API_VERSION}/namespaces/{NS}/{PLURAL}", json=doc)
    assert resp.status < 300, await resp.text()
    data: dict[str, Any] = await resp.json()
    return data


async def patch_cr(api: ApiServer, name: str, patch: dict[str, Any]) -> None:
    resp = await api.patch(
        f"/apis/{API_VERSION}/namespaces/{NS}/{PLURAL}/{name}",
        json=patch,
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert resp.status < 300, await resp.text()


def live(api: ApiServer, kind: str, name: str) -> dict[str, Any] | None:
    res = CR if kind == KIND else PODS if kind == "Pod" else CHILD_RESOURCES[kind]
    key = (res, NS, name)
    if key not in api.objects or api.objects[key].deleted:
        return None
    return copy.deepcopy(api.objects[key].raw)


def children(api: ApiServer) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for (res, _ns, name), obj in list(api.objects.items()):
        if res in CHILD_RESOURCES.values() and not obj.deleted:
            out[(obj.raw["kind"], name)] = copy.deepcopy(obj.raw)
    return out


def sts_hash(api: ApiServer, role: str, name: str = "demo") -> str:
    sts = live(api, "StatefulSet", f"{name}-{role}")
    assert sts is not None
    h: str = sts["spec"]["template"]["metadata"]["labels"]["pdx.dev/config-hash"]
    return h


async def make_pods(api: ApiServer, role: str, generation: str, count: int, *, ready: bool = True, name: str = "demo",
                    start: int = 0) -> None:  # fmt: skip
    """Play the StatefulSet controller and kubelet: pods of one config generation."""
    for i in range(start, start + count):
        pod_name = f"{name}-{role}-{generation[:4]}-{i}"
        labels = {
            "app.kubernetes.io/name": "pdx",
            "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": role,
        }
        if role != "router":
            labels.update({"pdx.dev/role": role, "pdx.dev/engine": "true", "pdx.dev/config-hash": generation})
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": NS, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
            "status": {
                "podIP": f"10.0.{len(role)}.{i + 1}",
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }
        resp = await api.post(f"/api/v1/namespaces/{NS}/pods", json=pod)
        assert resp.status < 300, await resp.text()


async def delete_pods(api: ApiServer, generation: str) -> None:
    for (res, _ns, name), obj in list(api.objects.items()):
        if res == PODS and not obj.deleted and obj.raw["metadata"]["labels"].get("pdx.dev/config-hash") == generation:
            await api.delete(f"/api/v1/namespaces/{NS}/pods/{name}")


def writes(api: ApiServer, since: int = 0) -> list[str]:
    """Write requests the server received after request number `since`, as 'METHOD path'."""
    return [f"{_verb(r)} {r.url.path}" for r in list(api)[since:] if _verb(r) in WRITES]


def request_count(api: ApiServer) -> int:
    return len(list(api))


async def eventually(check: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.05)


async def in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The operator's API client is synchronous (kopf runs it in threads); so do the tests,
    leaving the event loop free for kmock to answer."""
    return await asyncio.to_thread(fn, *args, **kwargs)


@pytest.fixture
async def operator(
    api: ApiServer, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Callable[..., Any]]:
    """`kopf run -A --standalone -m pdx.controller.handlers` in a thread (its own loop, as
    in production its own process), logged in through the kubeconfig that points at kmock.
    Stopping happens in a worker thread so this loop keeps serving kmock meanwhile."""
    from kopf.testing import KopfRunner

    import pdx.controller.handlers as handlers

    runners: list[KopfRunner] = []

    async def start(stats: Callable[[str], Any] | None = None) -> Callable[[], Any]:
        monkeypatch.setattr(handlers, "fetch_router_stats", stats or (lambda url: None))
        runner = KopfRunner(["run", "-A", "--standalone", "-m", "pdx.controller.handlers"], timeout=60)
        runner.__enter__()
        runners.append(runner)

        async def stop_it() -> None:
            if runner in runners:
                runners.remove(runner)
                await asyncio.to_thread(runner.__exit__, None, None, None)
                assert runner.exit_code == 0, runner.output

        return stop_it

    yield start
    for runner in list(runners):
        await asyncio.to_thread(runner.__exit__, None, None, None)


def _verb(request: kmock.Request) -> str:
    return str(getattr(request.method, "value", request.method))
