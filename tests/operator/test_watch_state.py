"""The operator reads watch-fed state: idle passes send nothing, a restart rebuilds the state
from the watches before acting, and its own writes are not repeated while the watch lags."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any

import kmock
import pytest

from pdx import kinds
from tests.operator.conftest import (
    NS,
    STS,
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


def _reads(api: ApiServer, since: int) -> list[str]:
    """GETs of one namespace's objects: the per-resource reads. The operator's watches and
    their listings (it runs with --all-namespaces) are cluster-wide paths."""
    return [
        f"GET {r.url.path}"
        for r in list(api)[since:]
        if str(getattr(r.method, "value", r.method)) == "GET" and "/namespaces/" in r.url.path
    ]


def _operator_writes(api: ApiServer, since: int) -> list[str]:
    """Writes of children and status; not events, nor kopf's own bookkeeping on the CR."""
    return [w for w in writes(api, since) if "/events" not in w and not w.endswith("/disaggregatedinferences/demo")]


async def _converged(api: ApiServer, operator: Start) -> Callable[[], Any]:
    stop: Callable[[], Any] = await operator()
    await create_cr(api, cr_document())
    await eventually(lambda: set(children(api)) == EXPECTED, what="all children")
    h = sts_hash(api, "prefill")
    await make_pods(api, "prefill", h, 2)
    await make_pods(api, "decode", h, 2)
    await make_pods(api, "router", "r", 1)
    await eventually(
        lambda: (live(api, "DisaggregatedInference", "demo") or {}).get("status", {}).get("ready") == "True"
    )
    await asyncio.sleep(1.0)  # the coalesced passes and kopf's bookkeeping
    return stop


async def test_restart_rebuilds_state_from_watches_before_acting(
    api: ApiServer, operator: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pdx.controller import handlers

    monkeypatch.setattr(handlers, "AUDIT_SECONDS", 3600.0, raising=False)
    stop = await _converged(api, operator)
    await stop()

    # The restarted operator's StatefulSet listing comes late, later than kopf takes to list
    # the CRs by itself: acting before it would find the engine sets missing and apply them
    # again. (kmock binds `_serve_list` when it starts; every request goes through `_handle`.)
    handle = ApiServer._handle
    held: list[str] = []

    async def slow_list(self: ApiServer, request: kmock.Request) -> Any:
        if request.resource == STS and request.action == kmock.action.LIST:
            held.append(request.url.path)
            await asyncio.sleep(4.0)
        return await handle(self, request)

    monkeypatch.setattr(ApiServer, "_handle", slow_list)
    since = request_count(api)
    await operator()
    await eventually(lambda: any("statefulsets" in r.url.path for r in list(api)[since:]), what="sts listing")
    await asyncio.sleep(6.0)  # the listing, then resume and timer passes
    assert held, "the StatefulSet listing was not held back"
    assert _operator_writes(api, since) == []
    assert _reads(api, since) == []  # everything came from the watches

    # The state is live: a deleted set comes back, once; an edit reaches each child once.
    since = request_count(api)
    resp = await api.delete(f"/apis/apps/v1/namespaces/{NS}/statefulsets/demo-prefill")
    assert resp.status == 200
    await eventually(lambda: live(api, "StatefulSet", "demo-prefill") is not None, timeout=10, what="restored")
    old = sts_hash(api, "decode")
    await patch_cr(api, "demo", {"spec": {"kvTransfer": {"decoderKvBlocksTtlSeconds": 1200}}})
    await eventually(lambda: old != sts_hash(api, "prefill") == sts_hash(api, "decode"), what="both rolled")
    await asyncio.sleep(1.6)  # timer ticks and child events after the writes
    per_child = collections.Counter(w.split("?")[0] for w in _operator_writes(api, since) if "/status" not in w)
    # prefill: restored, then rolled; every other child at most once (the rollout)
    assert per_child.pop(f"PATCH /apis/apps/v1/namespaces/{NS}/statefulsets/demo-prefill") == 2
    assert per_child and max(per_child.values()) == 1, per_child
    assert _reads(api, since) == []


def _obj(kind: str, name: str, rv: int, uid: str = "u") -> dict[str, Any]:
    labels = {"app.kubernetes.io/instance": "demo"}
    meta = {"name": name, "namespace": NS, "resourceVersion": str(rv), "uid": uid, "labels": labels}
    return {"apiVersion": "v1", "kind": kind, "metadata": meta}


def test_own_writes_stand_until_the_watch_catches_up() -> None:
    from pdx.controller.state import WatchState, index_id

    where = (NS, "demo")
    cr = {**_obj("DisaggregatedInference", "demo", 1), "status": {}}
    index: dict[str, dict[tuple[str, str], list[dict[str, Any]]]] = {index_id(k): {} for k in kinds.ALL}
    index[index_id(kinds.RESOURCE)][where] = [cr]
    index[index_id(kinds.CHILDREN[0])][where] = [_obj("Service", "demo-a", 5), _obj("Service", "demo-b", 6, "b")]
    state = WatchState()
    applied = _obj("Service", "demo-a", 9)
    patched = {**_obj("DisaggregatedInference", "demo", 10), "status": {"ready": "True"}}
    state.record(NS, "demo", {("Service", "demo-a"): applied, ("DisaggregatedInference", "demo"): patched},
                 {("Service", "demo-b"): "b"})  # fmt: skip

    snap = state.read_from(index, NS, "demo")
    assert snap is not None
    assert snap.children == {("Service", "demo-a"): applied}  # demo-b pruned, demo-a as applied
    assert snap.body["status"] == {"ready": "True"}

    # The echoes arrive (and someone edits demo-a since): the watch's copies take over.
    edited = _obj("Service", "demo-a", 11)
    index[index_id(kinds.CHILDREN[0])][where] = [edited]
    index[index_id(kinds.RESOURCE)][where] = [{**patched, "metadata": {**patched["metadata"], "resourceVersion": "10"}}]
    snap = state.read_from(index, NS, "demo")
    assert snap is not None and snap.children == {("Service", "demo-a"): edited}
    assert state.written == {where: {}} and state.deleted == {where: {}}

    # A recreated child (new uid) under a pruned name is not hidden.
    state.record(NS, "demo", {}, {("Service", "demo-a"): "u"})
    index[index_id(kinds.CHILDREN[0])][where] = [_obj("Service", "demo-a", 12, "new")]
    snap = state.read_from(index, NS, "demo")
    assert snap is not None and snap.children[("Service", "demo-a")]["metadata"]["uid"] == "new"
    assert state.deleted == {where: {}}


async def test_the_echoes_of_a_pass_trigger_no_second_pass(
    api: ApiServer, operator: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The StatefulSet and Deployment echoes arrive while the pass that applied them still
    runs (it records their versions when it returns); they must not make it go again."""
    from pdx.controller import handlers

    real_pass, real_work = handlers._pass, handlers._work
    passes: list[int] = []  # children in each pass's snapshot

    async def no_timer(*args: Any, stats: bool, **kw: Any) -> Any:
        return None if stats else await real_pass(*args, stats=stats, **kw)

    def counted(memo: Any, gate: Any, namespace: str, name: str, snap: Any, stats: bool, audit: bool) -> Any:
        passes.append(len(snap.children))
        return real_work(memo, gate, namespace, name, snap, stats, audit)

    monkeypatch.setattr(handlers, "_pass", no_timer)
    monkeypatch.setattr(handlers, "_work", counted)
    await operator()
    # Created once kopf watches: kmock delivers an object that exists when a watch starts
    # twice (listing and watch), kopf's second try at its finalizer fails, and only a later
    # event (the timer's writes, off here) would make it go on.
    await eventually(
        lambda: any(r.params.get("watch") == "true" and r.url.path.endswith("/disaggregatedinferences") for r in api),
        what="kopf's watch of the CRs",
    )
    await asyncio.sleep(0.2)
    await create_cr(api, cr_document())
    await eventually(lambda: set(children(api)) == EXPECTED, what="all children")
    await eventually(lambda: bool((live(api, "DisaggregatedInference", "demo") or {}).get("status")), what="status")
    await asyncio.sleep(1.0)  # the echoes, and any pass they caused
    assert passes == [0]  # the creation's pass alone, on a state with no children yet
