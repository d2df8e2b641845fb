"""Reconcile passes against the real API server and controllers, called the way the handlers
call them (formerly tests/operator/test_reconcile.py against kmock): the server's own
server-side apply, defaults, status schema and garbage collection; pods made by the real
StatefulSet and ReplicaSet controllers, scheduled by the real scheduler, Ready through kwok.
What the operator sent comes from the API server's audit log.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from pdx import kinds, labels
from pdx.controller.feed import Expired, Feed, Http
from pdx.controller.kube import Kube
from pdx.controller.reconcile import reconcile
from pdx.labels import APPLIED_HASH
from pdx.spec import API_VERSION, KIND
from tests.support.control_plane import KWOK_NOT_READY, ControlPlane, wait_for
from tests.support.operator_cluster import OPERATOR_USER, Cluster, cr_document, expected_children

pytestmark = pytest.mark.cluster

NAME = "demo"


def _writes(cp: ControlPlane, since: int) -> list[str]:
    """The operator's write requests after audit mark ``since``, as 'verb resource[/sub]/name'."""
    out = []
    for e in cp.audit(OPERATOR_USER, since):
        if e["verb"] in ("get", "list", "watch"):
            continue
        ref = e.get("objectRef") or {}
        sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
        out.append(f"{e['verb']} {ref.get('resource')}{sub}/{ref.get('name')}")
    return out


def _owners(obj: dict[str, Any], spec_field: str) -> set[str]:
    """The field managers the server records for ``spec.<spec_field>``."""
    return {
        m["manager"] for m in obj["metadata"]["managedFields"] if spec_field in m.get("fieldsV1", {}).get("f:spec", {})
    }


def _converged(cluster: Cluster, kube: Kube, name: str = NAME, **spec: Any) -> str:
    """Created, applied, every pod Ready, the endpoints published: the config hash."""
    cluster.create(cr_document(name, cluster.ns, **spec))
    cluster.run(name, kube)
    cluster.settled(name)
    cluster.run(name, kube)
    h = cluster.sts_hash(name, "prefill")
    assert cluster.generations(name) == {h}
    return h


def test_a_first_pass_applies_every_child_by_server_side_apply_owned_by_the_resource(
    cluster: Cluster, operator_kube: Kube, control_plane: ControlPlane
) -> None:
    cr = cluster.create(cr_document(NAME, cluster.ns))
    mark = control_plane.audit_mark()
    out = cluster.run(NAME, operator_kube)

    children = cluster.children(NAME)
    assert set(children) == expected_children(NAME)
    assert len(out.applied) == len(children) and all(a.endswith("(created)") for a in out.applied)
    for obj in children.values():
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref == {
            "apiVersion": API_VERSION, "kind": KIND, "name": NAME, "uid": cr["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True,
        }  # fmt: skip
        assert APPLIED_HASH in obj["metadata"]["annotations"]
        # The real server's record of who set what: the operator's fields, by apply.
        ours = [m for m in obj["metadata"]["managedFields"] if m["manager"] == labels.MANAGER]
        assert [m["operation"] for m in ours] == ["Apply"], obj["metadata"]["managedFields"]
    # Every write a server-side apply (a PATCH that created) with force, then one status patch;
    # none asks the server to decode it twice for warnings nobody reads (fieldValidation).
    applies = [e for e in control_plane.audit(OPERATOR_USER, mark) if e["verb"] == "patch"]
    children_applied = [e for e in applies if not e["objectRef"].get("subresource")]
    assert len(children_applied) == len(children)
    assert all(f"fieldManager={labels.MANAGER}" in e["requestURI"] and "force=true" in e["requestURI"]
               for e in children_applied)  # fmt: skip
    assert all("fieldValidation=Ignore" in e["requestURI"] for e in applies)
    assert {e["responseStatus"]["code"] for e in children_applied} == {201}  # created by the apply
    assert [e["objectRef"]["subresource"] for e in applies if e["objectRef"].get("subresource")] == ["status"]
    # The status the real status schema kept (nothing pruned).
    st = cluster.status(NAME)
    assert st["observedGeneration"] == 1
    assert st["configHash"] == cluster.sts_hash(NAME, "prefill") == cluster.sts_hash(NAME, "decode")
    assert st["routerAddress"] == f"http://{NAME}-router.{cluster.ns}.svc:8000"
    assert st["prefill"]["summary"] == "0/2" and st["ready"] == "False"  # no pod when it read
    assert cluster.conditions(NAME)["Progressing"]["status"] == "True"
    assert [e.reason for e in out.events] == ["Applied"]


def test_ready_pods_are_published_and_a_pass_with_nothing_changed_writes_nothing(
    cluster: Cluster, operator_kube: Kube, control_plane: ControlPlane
) -> None:
    cluster.create(cr_document(NAME, cluster.ns))
    cluster.run(NAME, operator_kube)
    h = cluster.sts_hash(NAME, "prefill")
    cluster.settled(NAME)  # the StatefulSet and ReplicaSet controllers' pods, Ready on kwok nodes
    out = cluster.run(NAME, operator_kube)
    assert sorted((e["role"], e["generation"]) for e in cluster.published(NAME)) == [
        ("decode", h), ("decode", h), ("prefill", h), ("prefill", h)
    ]  # fmt: skip
    engines = {p["metadata"]["name"]: p for role in ("prefill", "decode") for p in cluster.pods(NAME, role)}
    published = {e["name"]: e["url"] for e in cluster.published(NAME)}
    assert set(published) == set(engines)
    assert all(engines[n]["status"]["podIP"] in url for n, url in published.items())  # kwok's pod IPs
    assert cluster.conditions(NAME)["Ready"]["status"] == "True"
    assert cluster.status(NAME)["decode"]["summary"] == "2/2"
    assert "Ready" in [e.reason for e in out.events]

    versions = cluster.versions(NAME)
    mark = control_plane.audit_mark()
    out = cluster.run(NAME, operator_kube)
    time.sleep(0.3)  # the audit log's last lines
    assert out.writes == 0 and out.events == []
    assert _writes(control_plane, mark) == []
    assert control_plane.audit(OPERATOR_USER, mark)  # it did read
    assert cluster.versions(NAME) == versions


def test_one_decode_of_two_ready_is_published_and_the_resource_is_ready_with_decode_partly_available(
    cluster: Cluster, operator_kube: Kube
) -> None:
    """decode-1 runs (scheduled, with an address) but fails its readiness (kwok's stage holds it
    out of Ready): the first pass that sees the pods publishes both prefills and decode-0 only,
    and reports the resource Ready with decode PartiallyReady, 1/2."""
    cluster.create(cr_document(NAME, cluster.ns))
    cluster.run(NAME, operator_kube)
    h = cluster.sts_hash(NAME, "prefill")
    held = f"{NAME}-decode-1"
    wait_for(f"{held} created", lambda: cluster.live("Pod", held))
    key, value = KWOK_NOT_READY
    cluster.kube.call("PATCH", f"{cluster.where()}/pods/{held}", body={"metadata": {"annotations": {key: value}}},
                      content_type="application/merge-patch+json")  # fmt: skip

    def one_decode_ready() -> bool:
        pod = cluster.live("Pod", held)
        conditions = {c["type"]: c["status"] for c in (pod or {}).get("status", {}).get("conditions", [])}
        not_ready = pod is not None and pod["status"].get("phase") == "Running" and conditions.get("Ready") == "False"
        return not_ready and all(
            cluster.ready_pods(NAME, role, n) for role, n in (("prefill", 2), ("decode", 1), ("router", 1))
        )

    wait_for("prefill 2/2, decode 1/2, router 1/1 Ready", one_decode_ready)
    out = cluster.run(NAME, operator_kube)

    published = cluster.published(NAME)
    assert sorted((e["role"], e["generation"]) for e in published) == [
        ("decode", h), ("prefill", h), ("prefill", h)
    ]  # fmt: skip
    assert {e["name"] for e in published if e["role"] == "decode"} == {f"{NAME}-decode-0"}
    c = cluster.conditions(NAME)
    assert c["Ready"]["status"] == "True" and c["DecodeAvailable"]["reason"] == "PartiallyReady"
    assert cluster.status(NAME)["decode"]["summary"] == "1/2"
    assert "Ready" in [e.reason for e in out.events]


def test_a_ttl_edit_moves_both_statefulsets_in_one_pass_and_the_endpoints_flip_once(
    cluster: Cluster, operator_kube: Kube, control_plane: ControlPlane
) -> None:
    old = _converged(cluster, operator_kube)
    cluster.patch(KIND, NAME, {"spec": {"kvTransfer": {"decoderKvBlocksTtlSeconds": 900}}})
    mark = control_plane.audit_mark()
    out = cluster.run(NAME, operator_kube)
    new = cluster.sts_hash(NAME, "prefill")
    assert new != old and cluster.sts_hash(NAME, "decode") == new
    time.sleep(0.3)
    sts_writes = [w for w in _writes(control_plane, mark) if w.startswith("patch statefulsets/")]
    assert sorted(sts_writes) == [f"patch statefulsets/{NAME}-decode", f"patch statefulsets/{NAME}-prefill"]
    for role in ("prefill", "decode"):
        sts = cluster.live("StatefulSet", f"{NAME}-{role}")
        assert sts is not None
        assert '"decoder_kv_blocks_ttl":900' in " ".join(sts["spec"]["template"]["spec"]["containers"][0]["args"])
    assert "RollingOut" in [e.reason for e in out.events]
    assert cluster.generations(NAME) == {old}  # the old generation serves meanwhile
    assert cluster.conditions(NAME)["Progressing"]["reason"] == "RollingOut"

    # The real StatefulSet controller replaces the pods; a pass after each change of them
    # publishes one generation, the old one until the new one has as many pairs, never back.
    seen = [old]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        cluster.run(NAME, operator_kube)
        gens = cluster.generations(NAME)
        assert len(gens) == 1, f"endpoints pair two generations: {cluster.published(NAME)}"
        (gen,) = gens
        if not seen or seen[-1] != gen:
            seen.append(gen)
        if gens == {new} and cluster.conditions(NAME)["Progressing"]["status"] == "False":
            break
        time.sleep(0.2)
    assert seen == [old, new]
    assert cluster.status(NAME)["configHash"] == new
    assert cluster.conditions(NAME)["Progressing"]["status"] == "False"
    assert all(p["metadata"]["labels"][labels.CONFIG_HASH] == new for p in cluster.pods(NAME, "decode"))


def test_a_deleted_child_is_restored_and_a_hand_edit_taken_back(
    cluster: Cluster, operator_kube: Kube, control_plane: ControlPlane
) -> None:
    _converged(cluster, operator_kube)
    before = cluster.live("StatefulSet", f"{NAME}-decode")
    cluster.delete("StatefulSet", f"{NAME}-decode")
    assert cluster.live("StatefulSet", f"{NAME}-decode") is None
    cluster.patch("StatefulSet", f"{NAME}-prefill", {"spec": {"replicas": 7}})  # someone's kubectl edit
    out = cluster.run(NAME, operator_kube)
    assert sorted(a for a in out.applied if a.startswith("StatefulSet/")) == [
        f"StatefulSet/{NAME}-decode (created)", f"StatefulSet/{NAME}-prefill (repaired)"
    ]  # fmt: skip
    restored = cluster.live("StatefulSet", f"{NAME}-decode")
    assert restored is not None and before is not None
    assert restored["spec"] == before["spec"] and restored["metadata"]["uid"] != before["metadata"]["uid"]
    prefill = cluster.live("StatefulSet", f"{NAME}-prefill")
    assert prefill is not None and prefill["spec"]["replicas"] == 2  # forced back by server-side apply
    assert _owners(prefill, "f:replicas") == {labels.MANAGER}  # the hand edit's claim on the field is gone too
    assert "DriftRepaired" in [e.reason for e in out.events]


def test_a_scale_edit_does_not_roll_the_engines_and_prunes_the_budget(cluster: Cluster, operator_kube: Kube) -> None:
    h = _converged(cluster, operator_kube)
    cluster.patch(KIND, NAME, {"spec": {"prefill": {"replicas": 0}, "decode": {"replicas": 4}}})
    out = cluster.run(NAME, operator_kube)
    assert cluster.sts_hash(NAME, "prefill") == h == cluster.sts_hash(NAME, "decode")  # not a new config
    assert cluster.live("PodDisruptionBudget", f"{NAME}-prefill") is None
    assert out.pruned == [f"PodDisruptionBudget/{NAME}-prefill"]
    sts = cluster.live("StatefulSet", f"{NAME}-decode")
    assert sts is not None and sts["spec"]["replicas"] == 4
    wait_for("4 decodes and no prefill", lambda: cluster.ready_pods(NAME, "decode", 4, h)
             and not cluster.pods(NAME, "prefill"))  # fmt: skip
    wait_for("the same pods' generation in the endpoints", lambda: (
        cluster.run(NAME, operator_kube) is not None
        and sorted(e["role"] for e in cluster.published(NAME)) == ["decode"] * 4
    ))  # fmt: skip


def test_reuse_counters_reach_status_and_a_failed_read_changes_nothing(
    cluster: Cluster, operator_kube: Kube, control_plane: ControlPlane
) -> None:
    _converged(cluster, operator_kube)
    stats = {
        "reuse": {"hit": 9, "miss": 3, "expired": 1, "declined": 0, "prefix_mismatch": 0, "below_threshold": 0},
        "reusedTokens": 10, "entries": 2, "interTurnGapSeconds": {"count": 50, "p50": 30.0, "p95": 600.0, "max": 700.0},
    }  # fmt: skip
    urls: list[str] = []

    def fetch(url: str) -> dict[str, Any]:
        urls.append(url)
        return stats

    cluster.run(NAME, operator_kube, fetch_stats=fetch)
    want = {"hitRate": 0.9, "hits": 9, "expired": 1, "released": 0, "recommendedTtlSeconds": 690}
    assert cluster.status(NAME)["reuse"] == want  # kept by the CRD's status schema
    assert urls == [f"http://{NAME}-router.{cluster.ns}.svc:8000"]
    body = cluster.live(KIND, NAME)
    assert body is not None and body["spec"]["kvTransfer"]["decoderKvBlocksTtlSeconds"] == 480  # advice only

    def broken(url: str) -> Any:
        raise OSError("connection refused")

    mark = control_plane.audit_mark()
    cluster.run(NAME, operator_kube, fetch_stats=broken)
    time.sleep(0.3)
    assert _writes(control_plane, mark) == []  # the last numbers stay, nothing fails
    assert cluster.status(NAME)["reuse"] == want


@pytest.mark.parametrize("missing", ["deleted", "never-created"])
def test_a_pass_for_a_resource_that_is_gone_is_a_no_op(
    cluster: Cluster, operator_kube: Kube, control_plane: ControlPlane, missing: str
) -> None:
    if missing == "deleted":
        cluster.create(cr_document(NAME, cluster.ns))
        cluster.delete(KIND, NAME)
    mark = control_plane.audit_mark()
    assert reconcile(operator_kube, cluster.ns, NAME) is None
    time.sleep(0.3)
    assert _writes(control_plane, mark) == []


def test_applies_record_the_versions_their_watch_echoes_carry(cluster: Cluster, operator_kube: Kube) -> None:
    from pdx.controller import handlers

    cluster.create(cr_document(NAME, cluster.ns))
    out = cluster.run(NAME, operator_kube)
    assert set(out.versions) == expected_children(NAME)
    for (kind, name), version in out.versions.items():
        obj = cluster.live(kind, name)
        assert obj is not None
        if kind in ("ConfigMap", "Service", "NetworkPolicy"):  # written by nobody else
            assert obj["metadata"]["resourceVersion"] == version, (kind, name)
        else:  # the workload and disruption controllers write their status after the apply
            assert int(obj["metadata"]["resourceVersion"]) >= int(version), (kind, name)
    handlers._gate((cluster.ns, NAME)).written.update(out.versions)
    try:
        sts = cluster.live("StatefulSet", f"{NAME}-prefill")
        assert sts is not None
        ours = out.versions[("StatefulSet", f"{NAME}-prefill")]
        echo = {**sts, "metadata": {**sts["metadata"], "resourceVersion": ours}}
        assert handlers._is_echo({"type": "MODIFIED"}, echo, cluster.ns, NAME)
        assert not handlers._is_echo({"type": "DELETED"}, echo, cluster.ns, NAME)  # a deletion always counts
        assert not handlers._is_echo({"type": "MODIFIED"}, echo, cluster.ns, "other")

        # The StatefulSet controller's status write is someone else's version: news.
        def written_since() -> dict[str, Any] | None:
            got = cluster.live("StatefulSet", f"{NAME}-prefill")
            return got if got and got["metadata"]["resourceVersion"] != ours else None

        newer = wait_for("the StatefulSet controller's status write", written_since)
        assert not handlers._is_echo({"type": "MODIFIED"}, newer, cluster.ns, NAME)
    finally:
        handlers._gates.pop((cluster.ns, NAME), None)


def test_the_operator_never_writes_back_the_replicas_an_autoscaler_set(
    cluster: Cluster, operator_kube: Kube, control_plane: ControlPlane
) -> None:
    auto = {"minReplicas": 1, "maxReplicas": 4}
    cluster.create(cr_document(NAME, cluster.ns, decode={"replicas": 2, "autoscaling": auto}))
    cluster.run(NAME, operator_kube)
    assert cluster.live("HorizontalPodAutoscaler", f"{NAME}-decode") is not None
    # The HPA's write: through the scale subresource.
    path = f"/apis/apps/v1/namespaces/{cluster.ns}/statefulsets/{NAME}-decode/scale"
    cluster.kube.call("PATCH", path, body={"spec": {"replicas": 3}}, content_type="application/merge-patch+json")
    mark = control_plane.audit_mark()
    out = cluster.run(NAME, operator_kube)
    time.sleep(0.3)
    assert not [w for w in _writes(control_plane, mark) if "statefulsets" in w], _writes(control_plane, mark)
    sts = cluster.live("StatefulSet", f"{NAME}-decode")
    assert sts is not None and sts["spec"]["replicas"] == 3
    assert labels.MANAGER not in _owners(sts, "f:replicas")  # the operator's applies leave it alone
    assert out.status.get("decode", {}).get("desired", 3) == 3
    wait_for("3 decode pods", lambda: len(cluster.pods(NAME, "decode")) == 3)


async def test_a_feed_listing_replaces_its_store_and_reports_the_differences(
    cluster: Cluster, control_plane: ControlPlane
) -> None:
    sts_kind = next(k for k in kinds.CHILDREN if k.kind == "StatefulSet")

    def sts(name: str, managed: bool = True) -> dict[str, Any]:
        tags = {**labels.managed(), labels.INSTANCE: NAME} if managed else {labels.INSTANCE: NAME}
        return {
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": cluster.ns, "labels": tags},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}},
        }  # fmt: skip

    control_plane.apply(sts(f"{NAME}-prefill"), sts(f"{NAME}-decode"), sts("foreign", managed=False))
    seen: list[tuple[str, str]] = []
    http = Http(cluster.kube.api.configuration)
    feed = Feed(http, sts_kind, labels.managed(), namespace=cluster.ns,
                notify=lambda kind, obj: seen.append((kind, obj["metadata"]["name"])))  # fmt: skip
    try:
        await feed.relist()
        assert feed.listed.is_set() and seen == []  # the first listing is the state, not news
        # "foreign" carries the instance label but not the operator's: the server's selector keeps it out
        filed = feed.store.get((cluster.ns, NAME))
        assert sorted(o["metadata"]["name"] for o in filed) == [f"{NAME}-decode", f"{NAME}-prefill"]
        prefill = next(o for o in filed if o["metadata"]["name"] == f"{NAME}-prefill")
        assert prefill["kind"] == "StatefulSet"  # the real server's list items lack it; the state keys by kind

        feed.apply({"type": "ADDED", "object": dict(prefill)})  # a watch (re)start replaying it
        assert seen == []
        newer = {**prefill, "metadata": {**prefill["metadata"], "resourceVersion": "999999999"}}
        feed.apply({"type": "MODIFIED", "object": newer})
        assert seen == [("MODIFIED", f"{NAME}-prefill")]

        # A deletion the watch missed: the next listing drops it and says so.
        cluster.kube.delete("apps/v1", "StatefulSet", cluster.ns, f"{NAME}-decode")
        seen.clear()
        await feed.relist()
        assert ("DELETED", f"{NAME}-decode") in seen
        assert [o["metadata"]["name"] for o in feed.store.get((cluster.ns, NAME))] == [f"{NAME}-prefill"]

        with pytest.raises(Expired):
            feed.apply({"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}})
    finally:
        await http.close()
