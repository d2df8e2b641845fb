"""The whole kopf operator (pdx.controller.handlers) in this process against the real API
server's watch streams and the real controllers (formerly tests/operator against kmock):
repairs, edits, a restart mid-rollout, reuse counters, forgotten resources, a paused replica,
what kopf writes on the CR, and what an idle operator sends (the API server's audit log).
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.parse
from typing import Any

import pytest

from pdx import labels
from pdx.spec import KIND
from tests.support.control_plane import ControlPlane, wait_for
from tests.support.operator_cluster import (
    OPERATOR_USER,
    Cluster,
    InProcessOperator,
    cr_document,
    expected_children,
    quiet_for,
)

pytestmark = pytest.mark.cluster

NAME = "demo"


def _all_children(cluster: Cluster, name: str = NAME) -> bool:
    return set(cluster.children(name)) == expected_children(name)


def _ready(cluster: Cluster, name: str = NAME) -> bool:
    return cluster.status(name).get("ready") == "True"


def _started_converged(cluster: Cluster, op: InProcessOperator, **start: Any) -> str:
    op.start(**start)
    cluster.create(cr_document(NAME, cluster.ns))
    wait_for("all children", lambda: _all_children(cluster))
    wait_for("READY True", lambda: _ready(cluster))
    h = cluster.sts_hash(NAME, "prefill")
    wait_for("the endpoints published", lambda: len(cluster.published(NAME)) == 4)
    return h


def test_a_deleted_statefulset_and_configmap_come_back(
    cluster: Cluster, in_process_operator: InProcessOperator
) -> None:
    _started_converged(cluster, in_process_operator)
    before = cluster.live("StatefulSet", f"{NAME}-prefill")
    assert before is not None
    cluster.delete("StatefulSet", f"{NAME}-prefill")

    def recreated() -> dict[str, Any] | None:
        got = cluster.live("StatefulSet", f"{NAME}-prefill")
        return got if got and got["metadata"]["uid"] != before["metadata"]["uid"] else None

    restored = wait_for("the StatefulSet restored (its watch event)", recreated, timeout=20)
    assert restored["spec"]["template"] == before["spec"]["template"]
    cluster.delete("ConfigMap", f"{NAME}-router")  # an unwatched kind: the timer's audit repairs it
    wait_for("the router ConfigMap restored", lambda: cluster.live("ConfigMap", f"{NAME}-router") is not None, 20)


def test_the_bidirectional_switch_rolls_both_roles_to_one_new_hash(
    cluster: Cluster, in_process_operator: InProcessOperator
) -> None:
    old = _started_converged(cluster, in_process_operator)
    cluster.patch(KIND, NAME, {"spec": {"kvTransfer": {"bidirectional": False}}})

    def rolled() -> str | None:
        h = cluster.sts_hash(NAME, "prefill")
        return h if h != old and cluster.sts_hash(NAME, "decode") == h else None

    new = wait_for("both StatefulSets on one new hash", rolled, timeout=30)
    wait_for("observedGeneration 2", lambda: cluster.status(NAME).get("observedGeneration") == 2)
    assert cluster.status(NAME)["bidirectional"] is False
    for role in ("prefill", "decode"):
        sts = cluster.live("StatefulSet", f"{NAME}-{role}")
        assert sts is not None
        assert '"bidirectional_kv_xfer":false' in " ".join(sts["spec"]["template"]["spec"]["containers"][0]["args"])
    # The real StatefulSet controller replaces the pods; the operator then publishes the new pair.
    wait_for("the new generation published", lambda: cluster.generations(NAME) == {new}, timeout=60)
    wait_for("READY True on the new config", lambda: _ready(cluster) and cluster.status(NAME)["configHash"] == new)


def test_an_operator_restarted_mid_rollout_finishes_it(
    cluster: Cluster, in_process_operator: InProcessOperator
) -> None:
    op = in_process_operator
    old = _started_converged(cluster, op)
    op.stop()

    # The operator died after the edit reached the API and after it had applied only the
    # prefill StatefulSet: decode still runs the old template, prefill a half-done one (and
    # the real controller rolls prefill's pods to it).
    cluster.patch(KIND, NAME, {"spec": {"kvTransfer": {"decoderKvBlocksTtlSeconds": 1200}}})
    sts = cluster.live("StatefulSet", f"{NAME}-prefill")
    assert sts is not None
    half = {**sts["spec"]["template"]["metadata"]["labels"], labels.CONFIG_HASH: "half-done"}
    cluster.patch("StatefulSet", f"{NAME}-prefill", {"spec": {"template": {"metadata": {"labels": half}}}})
    wait_for("a half-done prefill pod", lambda: any(
        p["metadata"]["labels"].get(labels.CONFIG_HASH) == "half-done" for p in cluster.pods(NAME, "prefill")
    ))  # fmt: skip

    published: list[set[str]] = []
    op.start()  # restarted: resume runs the same pass

    def moved() -> str | None:
        published.append(cluster.generations(NAME))
        h = cluster.sts_hash(NAME, "decode")
        return h if cluster.sts_hash(NAME, "prefill") == h not in (old, "half-done") else None

    new = wait_for("both sets on the edit's hash", moved, timeout=30)

    def flipped() -> bool:
        published.append(cluster.generations(NAME))
        return published[-1] == {new}

    wait_for("the new generation published", flipped, timeout=60)
    assert all(len(g) <= 1 for g in published), published  # never two generations in the file
    assert "half-done" not in set().union(*published)  # a half-applied set is never paired
    wait_for("status on the new hash", lambda: cluster.status(NAME).get("configHash") == new)
    body = cluster.live(KIND, NAME)
    assert body is not None and body["spec"]["kvTransfer"]["decoderKvBlocksTtlSeconds"] == 1200


def test_reuse_counters_from_the_periodic_check_reach_status(
    cluster: Cluster, in_process_operator: InProcessOperator
) -> None:
    stats = {
        "reuse": {"hit": 4, "miss": 1, "expired": 1, "declined": 0, "prefix_mismatch": 0, "below_threshold": 0},
        "interTurnGapSeconds": {"count": 30, "p50": 10.0, "p95": 200.0, "max": 300.0},
    }
    urls: set[str] = set()

    def fetch(url: str) -> dict[str, Any]:
        urls.add(url)
        return stats

    in_process_operator.start(stats=fetch)
    cluster.create(cr_document(NAME, cluster.ns))
    wait_for("reuse in status", lambda: "reuse" in cluster.status(NAME), timeout=30)
    want = {"hitRate": 0.8, "hits": 4, "expired": 1, "released": 0, "recommendedTtlSeconds": 270}
    assert cluster.status(NAME)["reuse"] == want
    assert urls == {f"http://{NAME}-router.{cluster.ns}.svc:8000"}
    body = cluster.live(KIND, NAME)
    assert body is not None and body["spec"]["kvTransfer"]["decoderKvBlocksTtlSeconds"] == 480  # advice only


def test_an_edit_is_applied_while_the_router_never_answers_the_periodic_check(
    cluster: Cluster, in_process_operator: InProcessOperator
) -> None:
    """The router's counters are fetched beside the passes: a router that hangs (its Service
    name resolving slowly, say) holds no pass, so an edit still reaches both StatefulSets.
    Before, the periodic pass waited in the fetch holding its resource, and the edit behind it."""
    asked = threading.Event()
    release = threading.Event()

    def hangs(url: str) -> dict[str, Any] | None:
        asked.set()
        release.wait(120)
        return None

    try:
        old = _started_converged(cluster, in_process_operator, stats=hangs)
        wait_for("a periodic check asking the router", asked.is_set, timeout=10)
        cluster.patch(KIND, NAME, {"spec": {"kvTransfer": {"decoderKvBlocksTtlSeconds": 1200}}})
        wait_for("both StatefulSets on a new config", lambda: old != cluster.sts_hash(NAME, "prefill")
                 and cluster.sts_hash(NAME, "decode") == cluster.sts_hash(NAME, "prefill"), timeout=30)  # fmt: skip
        assert not release.is_set()  # the router still has not answered
    finally:
        release.set()


def test_a_deleted_resource_is_forgotten_and_nothing_is_written_for_it(
    cluster: Cluster, in_process_operator: InProcessOperator, control_plane: ControlPlane
) -> None:
    from pdx.controller import handlers

    _started_converged(cluster, in_process_operator)
    assert (cluster.ns, NAME) in handlers._gates
    cluster.delete(KIND, NAME)
    assert cluster.live(KIND, NAME) is None  # no finalizer holds it back
    mark = control_plane.audit_mark()
    wait_for("the gate forgotten", lambda: (cluster.ns, NAME) not in handlers._gates, timeout=10)
    # The real garbage collector deletes the children; their watch events wake the worker, and
    # it recreates nothing for a resource that is gone.
    wait_for("the children collected", lambda: not cluster.children(NAME), timeout=90)
    time.sleep(1.2)  # periodic ticks (0.5 s) after the last child event
    assert handlers._worker is not None and not handlers._worker.known((cluster.ns, NAME))
    writes = [e for e in control_plane.audit(OPERATOR_USER, mark) if e["verb"] not in ("get", "list", "watch")]
    assert [(e["verb"], e["objectRef"]["resource"]) for e in writes if e["objectRef"]["resource"] != "events"] == []
    assert not cluster.children(NAME)


def test_a_paused_operator_starts_no_pass_until_kopf_resumes_it(
    cluster: Cluster, in_process_operator: InProcessOperator
) -> None:
    """kopf pauses a replica through its pause switches (peering: another replica of higher
    priority); the worker reads the same switches, as the daemons kopf stopped did."""
    from pdx.controller import handlers, worker

    _started_converged(cluster, in_process_operator)
    assert handlers._worker is not None and handlers._worker._main is not None
    loop = handlers._worker._main.get_loop()  # kopf's, in its thread
    toggles = worker.PAUSE.toggles
    assert toggles is not None
    toggle = asyncio.run_coroutine_threadsafe(toggles.make_toggle(True, name="a peer of higher priority"), loop).result(
        10
    )
    time.sleep(0.3)
    cluster.delete("StatefulSet", f"{NAME}-prefill")
    time.sleep(1.5)  # three periodic ticks and the child event
    assert cluster.live("StatefulSet", f"{NAME}-prefill") is None
    asyncio.run_coroutine_threadsafe(toggles.drop_toggle(toggle), loop).result(10)
    wait_for("restored once resumed", lambda: cluster.live("StatefulSet", f"{NAME}-prefill") is not None, timeout=10)


def test_kopf_writes_nothing_on_the_resource_for_a_create_or_an_edit(
    cluster: Cluster, in_process_operator: InProcessOperator, control_plane: ControlPlane
) -> None:
    """Neither a finalizer (no daemon asks for one) nor its progress and diff base: those live
    in memory (pdx.controller.bookkeeping); the status subresource is the only write."""
    mark = control_plane.audit_mark()
    old = _started_converged(cluster, in_process_operator)
    cluster.patch(KIND, NAME, {"spec": {"kvTransfer": {"decoderKvBlocksTtlSeconds": 1200}}})
    wait_for("both rolled", lambda: old != cluster.sts_hash(NAME, "prefill") == cluster.sts_hash(NAME, "decode"))
    time.sleep(1.0)  # whatever kopf writes after its handler returned
    cr_writes = [
        f"{e['verb']} {e['requestURI']}"
        for e in control_plane.audit(OPERATOR_USER, mark)
        if e["verb"] not in ("get", "list", "watch")
        and e["objectRef"].get("resource") == "disaggregatedinferences"
        and e["objectRef"].get("subresource") != "status"
    ]
    assert cr_writes == []
    body = cluster.live(KIND, NAME)
    assert body is not None
    assert not body["metadata"].get("finalizers")  # so kopf blocks no deletion
    assert not [a for a in body["metadata"].get("annotations") or {} if a.endswith("last-handled-configuration")]


def test_an_idle_operator_sends_no_request_and_watches_only_its_own_objects(
    cluster: Cluster, in_process_operator: InProcessOperator, control_plane: ControlPlane,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from pdx.controller import handlers

    monkeypatch.setattr(handlers, "AUDIT_SECONDS", 3600.0)  # no audit pass in this window
    mark = control_plane.audit_mark()
    _started_converged(cluster, in_process_operator)
    time.sleep(1.0)  # the coalesced passes after the pods' last changes
    assert quiet_for(control_plane, OPERATOR_USER, 1.6) == []  # three timer ticks (0.5 s), nothing sent

    watches = {
        e["objectRef"]["resource"]: urllib.parse.unquote(e["requestURI"])
        for e in control_plane.audit(OPERATOR_USER, mark)
        if e["verb"] == "watch"
    }
    assert "labelSelector=app.kubernetes.io/name=pdx" in watches["pods"], watches["pods"]
    assert "labelSelector=app.kubernetes.io/managed-by=pdx-operator" in watches["configmaps"]
    assert "labelSelector" not in watches["disaggregatedinferences"]  # every resource is the operator's
