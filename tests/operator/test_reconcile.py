"""Reconcile passes against kmock over real HTTP, called the way the handlers call them."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest

from pdx.controller.kube import Kube
from pdx.controller.reconcile import Outcome, needs_apply, reconcile, stamp
from pdx.labels import APPLIED_HASH
from pdx.spec import API_VERSION, KIND
from tests.operator.conftest import (
    NS,
    ApiServer,
    children,
    cr_document,
    create_cr,
    delete_pods,
    in_thread,
    live,
    make_pods,
    patch_cr,
    request_count,
    sts_hash,
    writes,
)

EXPECTED = {
    ("Service", "demo-prefill"),
    ("StatefulSet", "demo-prefill"),
    ("Service", "demo-decode"),
    ("StatefulSet", "demo-decode"),
    ("ConfigMap", "demo-router"),
    ("ConfigMap", "demo-endpoints"),
    ("Deployment", "demo-router"),
    ("Service", "demo-router"),
    ("NetworkPolicy", "demo-prefill"),
    ("NetworkPolicy", "demo-decode"),
    ("NetworkPolicy", "demo-router"),
    ("PodDisruptionBudget", "demo-prefill"),
    ("PodDisruptionBudget", "demo-decode"),
}


async def run(kube: Kube, name: str = "demo", **kw: Any) -> Outcome:
    out: Outcome | None = await in_thread(reconcile, kube, NS, name, **kw)
    assert out is not None
    return out


def conditions(api: ApiServer, name: str = "demo") -> dict[str, dict[str, Any]]:
    body = live(api, KIND, name)
    assert body is not None
    return {c["type"]: c for c in body.get("status", {}).get("conditions", [])}


def published(api: ApiServer, name: str = "demo") -> list[dict[str, Any]]:
    cm = live(api, "ConfigMap", f"{name}-endpoints")
    assert cm is not None
    eps: list[dict[str, Any]] = json.loads(cm["data"]["endpoints.json"])["endpoints"]
    return eps


async def test_create_applies_all_children_owned_and_valid(api: ApiServer, kube: Kube) -> None:
    cr = await create_cr(api, cr_document())
    out = await run(kube)
    assert set(children(api)) == EXPECTED
    assert len(out.applied) == len(EXPECTED) and all(a.endswith("(created)") for a in out.applied)
    for obj in children(api).values():
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref == {
            "apiVersion": API_VERSION, "kind": KIND, "name": "demo", "uid": cr["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True,
        }  # fmt: skip
        assert APPLIED_HASH in obj["metadata"]["annotations"]
        kubernetes_validate.validate(obj, "1.37.0", strict=True)
    # every write was a server-side apply by one field manager
    applies = [r for r in api if "/status" not in r.url.path and r.params.get("fieldManager")]
    assert len(applies) == len(EXPECTED)
    assert {r.params["fieldManager"] for r in applies} == {"pdx-operator"}
    assert all(r.headers["Content-Type"] == "application/apply-patch+yaml" and r.params["force"] == "true"
               for r in applies)  # fmt: skip
    # status and events
    body = live(api, KIND, "demo")
    assert body is not None
    st = body["status"]
    assert st["observedGeneration"] == 1 and st["configHash"] == sts_hash(api, "prefill") == sts_hash(api, "decode")
    assert st["routerAddress"] == "http://demo-router.inference.svc:8000"
    assert st["prefill"]["summary"] == "0/2" and st["ready"] == "False"
    assert conditions(api)["Progressing"]["status"] == "True"
    assert [e.reason for e in out.events] == ["Applied"]


async def test_second_pass_with_nothing_changed_writes_nothing(api: ApiServer, kube: Kube) -> None:
    await create_cr(api, cr_document())
    await run(kube)
    h = sts_hash(api, "prefill")
    await make_pods(api, "prefill", h, 2)
    await make_pods(api, "decode", h, 2)
    await make_pods(api, "router", "r", 1)
    await run(kube)  # pods became ready: endpoints and status change once
    since = request_count(api)
    out = await run(kube)
    assert writes(api, since) == []
    assert out.writes == 0 and out.events == []
    assert request_count(api) > since  # it did read


async def test_pods_ready_publish_endpoints_and_ready_status(api: ApiServer, kube: Kube) -> None:
    await create_cr(api, cr_document())
    await run(kube)
    h = sts_hash(api, "prefill")
    await make_pods(api, "prefill", h, 2)
    await make_pods(api, "decode", h, 1)
    await make_pods(api, "router", "r", 1)
    out = await run(kube)
    assert {(e["role"], e["generation"]) for e in published(api)} == {("prefill", h), ("decode", h)}
    assert len(published(api)) == 3
    c = conditions(api)
    assert c["Ready"]["status"] == "True" and c["DecodeAvailable"]["reason"] == "PartiallyReady"
    body = live(api, KIND, "demo")
    assert body is not None and body["status"]["decode"]["summary"] == "1/2"
    assert "Ready" in [e.reason for e in out.events]


async def test_edit_ttl_moves_both_statefulsets_together_and_pairs_one_generation(api: ApiServer, kube: Kube) -> None:
    await create_cr(api, cr_document(ttl=480))
    await run(kube)
    old = sts_hash(api, "prefill")
    await make_pods(api, "prefill", old, 2)
    await make_pods(api, "decode", old, 2)
    await make_pods(api, "router", "r", 1)
    await run(kube)

    await patch_cr(api, "demo", {"spec": {"kvTransfer": {"decoderKvBlocksTtlSeconds": 900}}})
    since = request_count(api)
    out = await run(kube)
    new = sts_hash(api, "prefill")
    assert new != old and sts_hash(api, "decode") == new
    sts_writes = [w for w in writes(api, since) if "/statefulsets/" in w]
    assert sorted(sts_writes) == sorted(
        [f"PATCH /apis/apps/v1/namespaces/{NS}/statefulsets/demo-prefill",
         f"PATCH /apis/apps/v1/namespaces/{NS}/statefulsets/demo-decode"]
    )  # fmt: skip
    for role in ("prefill", "decode"):
        sts = live(api, "StatefulSet", f"demo-{role}")
        assert sts is not None
        assert '"decoder_kv_blocks_ttl":900' in " ".join(sts["spec"]["template"]["spec"]["containers"][0]["args"])
    assert "RollingOut" in [e.reason for e in out.events]
    assert {e["generation"] for e in published(api)} == {old}  # the old one serves meanwhile
    assert conditions(api)["Progressing"]["reason"] == "RollingOut"

    # the StatefulSet controller replaces pods one by one; at every step one generation is paired
    steps = [(1, 0), (1, 1), (2, 1), (2, 2)]
    seen: list[str] = []
    for p_new, d_new in steps:
        await delete_pods(api, old)
        await make_pods(api, "prefill", old, 2 - p_new)
        await make_pods(api, "decode", old, 2 - d_new)
        await delete_pods(api, new)
        await make_pods(api, "prefill", new, p_new, start=10)
        await make_pods(api, "decode", new, d_new, start=10)
        await run(kube)
        gens = {e["generation"] for e in published(api)}
        assert len(gens) == 1, f"endpoints pair two generations at step {p_new, d_new}: {gens}"
        seen.append(gens.pop())
    assert seen == [old, new, new, new]  # flips once, at equal capacity, never back
    body = live(api, KIND, "demo")
    assert body is not None and body["status"]["configHash"] == new
    assert conditions(api)["Progressing"]["status"] == "False"


async def test_deleted_child_is_restored_and_hand_edit_repaired(api: ApiServer, kube: Kube) -> None:
    await create_cr(api, cr_document())
    await run(kube)
    before = live(api, "StatefulSet", "demo-decode")
    resp = await api.delete(f"/apis/apps/v1/namespaces/{NS}/statefulsets/demo-decode")
    assert resp.status == 200 and live(api, "StatefulSet", "demo-decode") is None
    resp = await api.patch(
        f"/apis/apps/v1/namespaces/{NS}/statefulsets/demo-prefill",
        json={"spec": {"replicas": 7}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert resp.status == 200
    out = await run(kube)
    assert sorted(out.applied) == ["StatefulSet/demo-decode (created)", "StatefulSet/demo-prefill (repaired)"]
    restored = live(api, "StatefulSet", "demo-decode")
    assert restored is not None and before is not None and restored["spec"] == before["spec"]
    prefill = live(api, "StatefulSet", "demo-prefill")
    assert prefill is not None and prefill["spec"]["replicas"] == 2
    assert "DriftRepaired" in [e.reason for e in out.events]


def test_a_zero_value_the_api_server_leaves_out_is_no_drift() -> None:
    # A real API server stores a headless Service's `publishNotReadyAddresses: false` as
    # nothing (omitempty); against it every pass "repaired" both engine Services (tests/cluster).
    desired = stamp({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "demo-prefill", "namespace": NS},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": False, "ports": [{"port": 8000}]},
    })  # fmt: skip
    stored = json.loads(json.dumps(desired))
    del stored["spec"]["publishNotReadyAddresses"]
    stored["spec"].update(type="ClusterIP", sessionAffinity="None")  # server defaults
    stored["spec"]["ports"][0]["protocol"] = "TCP"
    assert needs_apply(desired, stored) is None
    # A hand edit to the non-zero value is still drift.
    stored["spec"]["publishNotReadyAddresses"] = True
    assert needs_apply(desired, stored) == "repaired"
    # And a non-zero rendered value missing live is too.
    del stored["spec"]["publishNotReadyAddresses"]
    del stored["spec"]["clusterIP"]
    assert needs_apply(desired, stored) == "repaired"


async def test_invalid_spec_sets_invalid_spec_and_applies_nothing(api: ApiServer, kube: Kube) -> None:
    await create_cr(api, cr_document())
    await run(kube)
    fleet_before = children(api)
    await patch_cr(api, "demo", {"spec": {"prefill": {"replicas": -1}}})
    since = request_count(api)
    out = await run(kube)
    assert writes(api, since) == [f"PATCH /apis/{API_VERSION}/namespaces/{NS}/disaggregatedinferences/demo/status"]
    assert children(api) == fleet_before
    c = conditions(api)
    assert c["InvalidSpec"]["status"] == "True" and "spec.prefill.replicas" in c["InvalidSpec"]["message"]
    assert c["Degraded"]["reason"] == "InvalidSpec"
    assert [(e.type, e.reason) for e in out.events] == [("Warning", "InvalidSpec")]
    # a second pass on the same invalid spec neither writes nor repeats the event
    since = request_count(api)
    out = await run(kube)
    assert writes(api, since) == [] and out.events == []

    await patch_cr(api, "demo", {"spec": {"prefill": {"replicas": 3}}})
    out = await run(kube)
    assert conditions(api)["InvalidSpec"]["status"] == "False"
    sts = live(api, "StatefulSet", "demo-prefill")
    assert sts is not None and sts["spec"]["replicas"] == 3
    assert "SpecValid" in [e.reason for e in out.events]


async def test_scale_edit_does_not_roll_engines_and_prunes_budget(api: ApiServer, kube: Kube) -> None:
    await create_cr(api, cr_document())
    await run(kube)
    h = sts_hash(api, "prefill")
    await patch_cr(api, "demo", {"spec": {"prefill": {"replicas": 0}, "decode": {"replicas": 4}}})
    out = await run(kube)
    assert sts_hash(api, "prefill") == h == sts_hash(api, "decode")  # scaling is not a new config
    assert live(api, "PodDisruptionBudget", "demo-prefill") is None
    assert out.pruned == ["PodDisruptionBudget/demo-prefill"]
    sts = live(api, "StatefulSet", "demo-decode")
    assert sts is not None and sts["spec"]["replicas"] == 4


async def test_reuse_counters_reach_status_and_failures_do_not(api: ApiServer, kube: Kube) -> None:
    await create_cr(api, cr_document())
    stats = {
        "reuse": {"hit": 9, "miss": 3, "expired": 1, "declined": 0, "prefix_mismatch": 0, "below_threshold": 0},
        "reusedTokens": 10, "entries": 2, "interTurnGapSeconds": {"count": 50, "p50": 30.0, "p95": 600.0, "max": 700.0},
    }  # fmt: skip
    urls: list[str] = []

    def fetch(url: str) -> dict[str, Any]:
        urls.append(url)
        return stats

    await run(kube, fetch_stats=fetch)
    body = live(api, KIND, "demo")
    assert body is not None
    want = {"hitRate": 0.9, "hits": 9, "expired": 1, "released": 0, "recommendedTtlSeconds": 690}
    assert body["status"]["reuse"] == want
    assert urls == ["http://demo-router.inference.svc:8000"]
    assert body["spec"]["kvTransfer"]["decoderKvBlocksTtlSeconds"] == 480  # advice only

    def broken(url: str) -> Any:
        raise OSError("connection refused")

    since = request_count(api)
    await run(kube, fetch_stats=broken)
    assert writes(api, since) == []  # the last numbers stay, nothing fails


@pytest.mark.parametrize("missing", ["demo", "other"])
async def test_gone_resource_is_a_no_op(api: ApiServer, kube: Kube, missing: str) -> None:
    if missing == "demo":
        await create_cr(api, cr_document())
        resp = await api.delete(f"/apis/{API_VERSION}/namespaces/{NS}/disaggregatedinferences/demo")
        assert resp.status == 200
    assert await in_thread(reconcile, kube, NS, "demo") is None


async def test_applies_record_the_versions_their_watch_echoes_carry(api: ApiServer, kube: Kube) -> None:
    from pdx.controller import handlers

    await create_cr(api, cr_document())
    out = await run(kube)
    assert set(out.versions) == EXPECTED
    for (kind, name), version in out.versions.items():
        obj = live(api, kind, name)
        assert obj is not None and obj["metadata"]["resourceVersion"] == version
    handlers._gate((NS, "demo")).written.update(out.versions)
    try:
        sts = live(api, "StatefulSet", "demo-prefill")
        assert sts is not None
        assert handlers._is_echo({"type": "MODIFIED"}, sts, NS, "demo")
        assert not handlers._is_echo({"type": "DELETED"}, sts, NS, "demo")  # a deletion always counts
        newer = {**sts, "metadata": {**sts["metadata"], "resourceVersion": "someone-else"}}
        assert not handlers._is_echo({"type": "MODIFIED"}, newer, NS, "demo")
        assert not handlers._is_echo({"type": "MODIFIED"}, sts, NS, "other")
    finally:
        handlers._gates.pop((NS, "demo"), None)
