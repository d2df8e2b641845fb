"""The operator's API paths for its own resource, against the real server: pdx.controller.kube's
get, list and status patch, one whole reconcile pass, and kopf's list-then-watch of the CR."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import kopf
import pytest
from kopf._cogs.clients import watching
from kopf._cogs.clients.auth import vault_var
from kopf._cogs.structs import credentials, references

from pdx.controller.kube import Kube
from pdx.controller.reconcile import reconcile
from pdx.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION
from tests.apiserver.client import Api, cr_path

pytestmark = pytest.mark.apiserver


def cr(namespace: str, name: str, labels: dict[str, str] | None = None, ttl: int = 480) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"model": {"name": "Qwen/Qwen3-32B"}, "kvTransfer": {"decoderKvBlocksTtlSeconds": ttl}},
    }


def test_get_resource_returns_the_stored_object_and_none_when_absent(api: Api, kube: Kube, namespace: str) -> None:
    code, stored = api.apply(cr(namespace, "demo"))
    assert code == 201, stored
    got = kube.get_resource(namespace, "demo")
    assert got is not None and got["metadata"]["uid"] == stored["metadata"]["uid"] and got["spec"] == stored["spec"]
    assert kube.get_resource(namespace, "absent") is None


def test_list_selects_by_label_on_the_server(api: Api, kube: Kube, namespace: str) -> None:
    for name, team in (("a", "search"), ("b", "chat"), ("c", "search")):
        assert api.apply(cr(namespace, name, {"team": team}))[0] == 201
    found = kube.list(API_VERSION, KIND, namespace, {"team": "search"})
    assert sorted(o["metadata"]["name"] for o in found) == ["a", "c"]
    assert all(o["apiVersion"] == API_VERSION and o["kind"] == KIND for o in found)
    assert len(kube.list(API_VERSION, KIND, namespace, {})) == 3
    assert kube.list(API_VERSION, KIND, "elsewhere", {}) == []


def test_patch_status_merges_only_the_keys_given(api: Api, kube: Kube, namespace: str) -> None:
    assert api.apply(cr(namespace, "demo"))[0] == 201
    kube.patch_status(namespace, "demo", {"ready": "False", "configHash": "h1"})
    kube.patch_status(namespace, "demo", {"ready": "True"})
    got = kube.get_resource(namespace, "demo")
    assert got is not None and got["status"] == {"ready": "True", "configHash": "h1", "conditions": []}


def test_a_reconcile_pass_reads_the_cr_and_writes_an_accepted_status(api: Api, kube: Kube, namespace: str) -> None:
    """This server has no apps/v1 or core API: the pass's first child apply fails (404), and the
    status says so, through the same get/list/patch calls a cluster gets."""
    assert api.apply(cr(namespace, "demo"))[0] == 201
    out = reconcile(kube, namespace, "demo", now=lambda: "2026-01-01T00:00:00Z")
    assert out is not None and out.error is not None and "HTTP 404" in out.error
    live = api.get(cr_path(namespace, "demo"))
    assert live["status"] == out.status  # the first pass writes every key
    conds = {c["type"]: c for c in live["status"]["conditions"]}
    assert (conds["Degraded"]["status"], conds["Degraded"]["reason"]) == ("True", "ApplyFailed")
    assert live["status"]["observedGeneration"] == 1 and live["status"]["bidirectional"] is True
    again = reconcile(kube, namespace, "demo", now=lambda: "2026-01-01T00:01:00Z")
    assert again is not None and again.status == {}  # nothing changed: no status write


@contextlib.asynccontextmanager
async def kopf_login(api: Api) -> Any:
    """kopf's own API session (aiohttp), with the client certificate."""
    vault = credentials.Vault()
    cert, key = api.server.client_cert
    info = credentials.ConnectionInfo(
        server=api.server.url, ca_path=str(api.server.ca), certificate_path=cert, private_key_path=key
    )
    await vault.populate({"pdx-test": info})
    token = vault_var.set(vault)
    try:
        yield
    finally:
        vault_var.reset(token)
        await vault.close()


async def test_kopf_lists_then_watches_the_cr_edits_and_deletion(api: Api, namespace: str) -> None:
    assert api.apply(cr(namespace, "demo"))[0] == 201
    resource = references.Resource(
        group=GROUP, version=VERSION, plural=PLURAL, kind=KIND, namespaced=True,
        verbs=frozenset({"list", "watch", "get", "patch"}),
    )  # fmt: skip
    settings = kopf.OperatorSettings()
    settings.watching.server_timeout = 5
    seen: list[tuple[str | None, int | None]] = []
    async with kopf_login(api):
        pause = asyncio.get_running_loop().create_future()

        async def watch() -> None:
            stream = watching.continuous_watch(
                settings=settings, resource=resource, namespace=references.NamespaceName(namespace),
                operator_pause_waiter=pause,
            )
            async for event in stream:
                if isinstance(event, dict) and event["type"] != "BOOKMARK":
                    ttl = (event["object"].get("spec") or {}).get("kvTransfer", {}).get("decoderKvBlocksTtlSeconds")
                    seen.append((event["type"], ttl))
                    if event["type"] == "DELETED":
                        return
                elif event == watching.Bookmark.LISTED:
                    listed.set()

        listed = asyncio.Event()
        task = asyncio.create_task(watch())
        await asyncio.wait_for(listed.wait(), 10)
        assert (await asyncio.to_thread(api.apply, cr(namespace, "demo", ttl=600)))[0] == 200
        code, _ = await asyncio.to_thread(api.request, "DELETE", cr_path(namespace, "demo"))
        assert code == 200
        await asyncio.wait_for(task, 15)
    assert seen == [(None, 480), ("MODIFIED", 600), ("DELETED", 600)]
