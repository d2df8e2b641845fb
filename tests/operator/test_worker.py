"""The operator's one worker (child events, periodic passes) instead of a kopf daemon per CR:
deleted CRs are forgotten, a paused replica passes nothing, and the Events the pass threads
post are the ones kopf's poster wrote."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from typing import Any

import pytest

from pdx.spec import API_VERSION, KIND, PLURAL
from tests.operator.conftest import (
    NS,
    ApiServer,
    children,
    cr_document,
    create_cr,
    eventually,
    live,
    request_count,
    writes,
)
from tests.operator.test_reconcile import EXPECTED

Start = Callable[..., Any]


async def test_a_deleted_cr_is_forgotten_and_nothing_is_written_for_it(api: ApiServer, operator: Start) -> None:
    from pdx.controller import handlers

    await operator()
    await create_cr(api, cr_document())
    await eventually(lambda: set(children(api)) == EXPECTED, what="all children")
    await eventually(lambda: bool((live(api, KIND, "demo") or {}).get("status")), what="status")
    assert (NS, "demo") in handlers._gates
    resp = await api.delete(f"/apis/{API_VERSION}/namespaces/{NS}/{PLURAL}/demo")
    assert resp.status == 200
    assert live(api, KIND, "demo") is None  # no finalizer holds it back
    # kmock has no garbage collector: the children stay, and their events wake the worker too.
    sts = f"/apis/apps/v1/namespaces/{NS}/statefulsets/demo-prefill"
    assert (await api.delete(sts)).status == 200
    since = request_count(api)
    await eventually(lambda: (NS, "demo") not in handlers._gates, timeout=5, what="the gate forgotten")
    await asyncio.sleep(1.2)  # periodic ticks (0.5 s) and the child event
    assert handlers._worker is not None and not handlers._worker.known((NS, "demo"))
    assert [w for w in writes(api, since) if "/events" not in w] == []  # nothing recreated for a deleted CR


async def test_a_paused_operator_starts_no_pass_until_kopf_resumes_it(api: ApiServer, operator: Start) -> None:
    """kopf pauses a replica through its pause switches (peering: another replica of higher
    priority); the worker reads the same switches, as the daemons kopf stopped did."""
    from pdx.controller import handlers, worker

    await operator()
    await create_cr(api, cr_document())
    await eventually(lambda: set(children(api)) == EXPECTED, what="all children")
    await eventually(lambda: bool((live(api, KIND, "demo") or {}).get("status")), what="status")
    assert handlers._worker is not None and handlers._worker._main is not None
    loop = handlers._worker._main.get_loop()  # kopf's, in its thread
    toggles = worker.PAUSE.toggles
    assert toggles is not None
    toggle = await asyncio.wrap_future(
        asyncio.run_coroutine_threadsafe(toggles.make_toggle(True, name="a peer of higher priority"), loop)
    )
    await asyncio.sleep(0.3)
    since = request_count(api)
    assert (await api.delete(f"/apis/apps/v1/namespaces/{NS}/statefulsets/demo-prefill")).status == 200
    await asyncio.sleep(1.5)  # three periodic ticks and the child event
    assert live(api, "StatefulSet", "demo-prefill") is None
    assert [w for w in writes(api, since) if "/events" not in w and "/statefulsets/" in w] == [
        f"DELETE /apis/apps/v1/namespaces/{NS}/statefulsets/demo-prefill"
    ]
    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(toggles.drop_toggle(toggle), loop))
    await eventually(lambda: live(api, "StatefulSet", "demo-prefill") is not None, timeout=10, what="restored")


async def test_the_events_are_those_kopfs_poster_wrote(monkeypatch: pytest.MonkeyPatch) -> None:
    import kopf
    from kopf._cogs.clients import api as kopf_api
    from kopf._cogs.clients import events as kopf_events

    from pdx.controller.kube import EventSource, event_body

    sent: list[dict[str, Any]] = []

    async def post(*, url: str, payload: dict[str, Any], **_: Any) -> None:
        sent.append({"url": url, **payload})

    monkeypatch.setattr(kopf_api, "post", post)
    body = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "demo", "namespace": NS, "uid": "u-1", "resourceVersion": "3", "labels": {"a": "b"}},
        "spec": {"x": 1},
    }
    settings = kopf.OperatorSettings()
    settings.posting.reporting_component = "pdx-operator"
    settings.posting.reporting_instance = "replica-a"
    settings.posting.event_name_prefix = "pdx-"
    ref = kopf.build_object_reference(kopf.Body(body))  # type: ignore[arg-type]
    resource = kopf.Resource("", "v1", "events", namespaced=True)
    message = "config abc: Service/demo-prefill (created), " + "StatefulSet/é (updated) " * 30
    await kopf_events.post_event(
        ref=ref, type="Normal", reason="Applied", message=message[:1000], resource=resource, settings=settings,
        logger=kopf.LocalObjectLogger(body=kopf.Body(body), settings=settings),  # type: ignore[arg-type]
    )  # fmt: skip
    source = EventSource(component="pdx-operator", instance="replica-a", name_prefix="pdx-")
    ours = event_body(body, "Normal", "Applied", message[:1000], source)
    (theirs,) = sent
    assert theirs.pop("url") == f"/api/v1/namespaces/{NS}/events"
    stamps = ("firstTimestamp", "lastTimestamp", "eventTime")
    for stamp in stamps:  # both "now", in the same format
        a, b = datetime.datetime.fromisoformat(theirs.pop(stamp)), datetime.datetime.fromisoformat(ours.pop(stamp))
        assert abs((a - b).total_seconds()) < 5 and a.tzinfo is not None and b.tzinfo is not None
    assert ours == theirs
