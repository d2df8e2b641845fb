"""The operator's own list+watch feed of a child kind: a listing replaces the store and reports
what changed, a watch's replay of what the store has reports nothing, an expired version lists
again, and objects without the operator's labels never enter."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s_client

from pdx import kinds, labels
from pdx.controller.feed import Expired, Feed, Http
from tests.operator.conftest import NS, ApiServer

STS = next(k for k in kinds.CHILDREN if k.kind == "StatefulSet")


def _sts(name: str, instance: str = "demo", managed: bool = True) -> dict[str, Any]:
    tags = {**labels.managed(), labels.INSTANCE: instance} if managed else {labels.INSTANCE: instance}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "namespace": NS, "labels": tags}}


async def test_a_listing_replaces_the_store_and_reports_the_differences(api: ApiServer) -> None:
    for body in (_sts("demo-prefill"), _sts("demo-decode"), _sts("foreign", managed=False)):
        resp = await api.post(f"/apis/apps/v1/namespaces/{NS}/statefulsets", json=body)
        assert resp.status < 300, await resp.text()
    seen: list[tuple[str, str]] = []
    http = Http(k8s_client.Configuration(host=str(api.url).rstrip("/")))
    feed = Feed(http, STS, labels.managed(), notify=lambda kind, obj: seen.append((kind, obj["metadata"]["name"])))
    try:
        await feed.relist()
        assert feed.listed.is_set() and seen == []  # the first listing is the state, not news
        # "foreign" carries the instance label but not the operator's: never filed
        assert sorted(o["metadata"]["name"] for o in feed.store.get((NS, "demo"))) == ["demo-decode", "demo-prefill"]
        prefill = next(o for o in feed.store.get((NS, "demo")) if o["metadata"]["name"] == "demo-prefill")
        assert prefill["kind"] == "StatefulSet"  # list items lack it; the state keys by kind

        feed.apply({"type": "ADDED", "object": dict(prefill)})  # a watch (re)start replaying it
        assert seen == []
        newer = {**prefill, "metadata": {**prefill["metadata"], "resourceVersion": "999"}}
        feed.apply({"type": "MODIFIED", "object": newer})
        assert seen == [("MODIFIED", "demo-prefill")]

        # A deletion the watch missed: the next listing drops it and says so.
        resp = await api.delete(f"/apis/apps/v1/namespaces/{NS}/statefulsets/demo-decode")
        assert resp.status == 200
        seen.clear()
        await feed.relist()
        assert ("DELETED", "demo-decode") in seen
        assert [o["metadata"]["name"] for o in feed.store.get((NS, "demo"))] == ["demo-prefill"]

        with pytest.raises(Expired):
            feed.apply({"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}})
    finally:
        await http.close()
