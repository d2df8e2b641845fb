"""The whole operator (kopf with pdx.controller.handlers) against kmock's watch streams."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from pdx.controller.kube import Kube
from pdx.spec import API_VERSION, KIND
from tests.operator.conftest import (
    NS,
    ApiServer,
    children,
    cr_document,
    create_cr,
    eventually,
    live,
    make_pods,
    patch_cr,
    request_count,
    sts_hash,
    writes,
)
from tests.operator.test_reconcile import EXPECTED

Start = Callable[..., Any]


def status_of(api: ApiServer) -> dict[str, Any]:
    body = live(api, KIND, "demo")
    return (body or {}).get("status") or {}


def endpoint_generations(api: ApiServer) -> set[str]:
    cm = live(api, "ConfigMap", "demo-endpoints")
    if cm is None:
        return set()
    return {e["generation"] for e in json.loads(cm["data"]["endpoints.json"])["endpoints"]}


async def test_create_then_settles_without_writes(api: ApiServer, kube: Kube, operator: Start) -> None:
    await operator()
    await create_cr(api, cr_document())
    await eventually(lambda: set(children(api)) == EXPECTED, what="all children")
    await eventually(lambda: bool(status_of(api).get("conditions")), what="status")
    h = sts_hash(api, "prefill")
    await make_pods(api, "prefill", h, 2)
    await make_pods(api, "decode", h, 2)
    await make_pods(api, "router", "r", 1)
    await eventually(lambda: status_of(api).get("ready") == "True", what="Ready")  # via the timer
    await asyncio.sleep(1.0)  # let the coalesced passes and kopf's own bookkeeping finish
    since = request_count(api)
    await asyncio.sleep(1.6)  # three timer ticks (0.5 s) with nothing changed
    assert [w for w in writes(api, since) if "/events" not in w] == []
    assert request_count(api) > since  # the timer did run and read
    events = [r.data for r in api if r.url.path.endswith("/events") and isinstance(r.data, dict)]
    assert {"Applied", "Ready"} <= {e.get("reason") for e in events}
    assert all(e["involvedObject"]["kind"] == KIND for e in events)


async def test_deleted_statefulset_comes_back(api: ApiServer, kube: Kube, operator: Start) -> None:
    await operator()
    await create_cr(api, cr_document())
    await eventually(lambda: set(children(api)) == EXPECTED, what="all children")
    resp = await api.delete(f"/apis/apps/v1/namespaces/{NS}/statefulsets/demo-prefill")
    assert resp.status == 200
    await eventually(lambda: live(api, "StatefulSet", "demo-prefill") is not None, timeout=20, what="restored")
    resp = await api.delete(f"/api/v1/namespaces/{NS}/configmaps/demo-router")
    assert resp.status == 200
    await eventually(lambda: live(api, "ConfigMap", "demo-router") is not None, timeout=20, what="timer repair")


async def test_edit_rolls_both_roles(api: ApiServer, kube: Kube, operator: Start) -> None:
    await operator()
    await create_cr(api, cr_document())
    await eventually(lambda: set(children(api)) == EXPECTED, what="all children")
    old = sts_hash(api, "prefill")
    await patch_cr(api, "demo", {"spec": {"kvTransfer": {"bidirectional": False}}})
    # one pass applies both sets (prefill, then decode, a few ms apart)
    await eventually(lambda: old != sts_hash(api, "prefill") == sts_hash(api, "decode"), what="both rolled")
    await eventually(lambda: status_of(api).get("observedGeneration") == 2, what="observedGeneration")
    assert status_of(api)["bidirectional"] is False


async def test_restart_mid_rollout_converges(api: ApiServer, kube: Kube, operator: Start) -> None:
    stop = await operator()
    await create_cr(api, cr_document(ttl=480))
    await eventually(lambda: set(children(api)) == EXPECTED, what="all children")
    old = sts_hash(api, "prefill")
    await make_pods(api, "prefill", old, 2)
    await make_pods(api, "decode", old, 2)
    await make_pods(api, "router", "r", 1)
    await eventually(lambda: endpoint_generations(api) == {old}, what="old endpoints")
    await stop()

    # The operator died after the edit reached the API and after it had applied only the
    # prefill StatefulSet: decode still runs the old template.
    await patch_cr(api, "demo", {"spec": {"kvTransfer": {"decoderKvBlocksTtlSeconds": 1200}}})
    sts = live(api, "StatefulSet", "demo-prefill")
    assert sts is not None
    new_labels = {**sts["spec"]["template"]["metadata"]["labels"], "pdx.dev/config-hash": "half-done"}
    resp = await api.patch(
        f"/apis/apps/v1/namespaces/{NS}/statefulsets/demo-prefill",
        json={"spec": {"template": {"metadata": {"labels": new_labels}}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert resp.status == 200
    await make_pods(api, "prefill", "half-done", 1, start=20)  # one pod of the half-applied set

    await operator()  # restarted: resume runs the same pass
    await eventually(
        lambda: sts_hash(api, "prefill") == sts_hash(api, "decode") not in (old, "half-done"), what="both moved"
    )
    new = sts_hash(api, "decode")
    assert endpoint_generations(api) == {old}  # nothing of the new generation is ready yet
    await eventually(lambda: status_of(api).get("configHash") == new, what="status hash")
    await make_pods(api, "prefill", new, 2, start=30)
    await make_pods(api, "decode", new, 2, start=30)
    await eventually(lambda: endpoint_generations(api) == {new}, what="new endpoints")
    body = live(api, KIND, "demo")
    assert body is not None and body["spec"]["kvTransfer"]["decoderKvBlocksTtlSeconds"] == 1200


async def test_reuse_counters_from_the_periodic_check(api: ApiServer, kube: Kube, operator: Start) -> None:
    stats = {
        "reuse": {"hit": 4, "miss": 1, "expired": 1, "declined": 0, "prefix_mismatch": 0, "below_threshold": 0},
        "interTurnGapSeconds": {"count": 30, "p50": 10.0, "p95": 200.0, "max": 300.0},
    }
    await operator(stats=lambda url: stats)
    await create_cr(api, cr_document())
    await eventually(lambda: "reuse" in status_of(api), what="reuse in status")
    want = {"hitRate": 0.8, "hits": 4, "expired": 1, "released": 0, "recommendedTtlSeconds": 270}
    assert status_of(api)["reuse"] == want
    assert API_VERSION  # the CR itself is untouched by advice
    body = live(api, KIND, "demo")
    assert body is not None and body["spec"]["kvTransfer"]["decoderKvBlocksTtlSeconds"] == 480
