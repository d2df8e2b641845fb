"""The Events the operator's pass threads post are the ones kopf's poster wrote. (Its worker
against a server, forgotten resources and a paused replica: tests/cluster/test_operator_in_process.py.)"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import pytest

from pdx.spec import API_VERSION, KIND
from tests.operator.conftest import (
    NS,
)

Start = Callable[..., Any]


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
