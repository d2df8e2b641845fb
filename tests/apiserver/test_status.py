"""What the operator writes into status goes through the real status subresource unchanged, and
the server's Table output shows the printer columns README's `kubectl get dinf` line names."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest

from pdx.controller import status
from pdx.controller.kube import Kube
from pdx.controller.reconcile import _previous_status, _status_delta
from pdx.controller.rollout import PodView
from pdx.spec import API_VERSION, KIND, ReuseStatus
from tests.apiserver.client import Api, cr_path
from tests.apiserver.server import ROOT
from tests.operator.test_policies import fleet, pods

pytestmark = pytest.mark.apiserver

NOW = "2026-01-01T00:00:00Z"
LATER = "2026-01-01T00:05:00Z"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


CRASHING = PodView(
    name="demo-decode-1", role="decode", generation="h1", ready=False, waiting_reason="CrashLoopBackOff",
    termination="EFAUnavailable: fi_info -p efa found no EFA provider; NIXL would fall back to TCP",
)  # fmt: skip
# One life of a resource, in the order the operator would write it: every condition type and
# every reason status.compute can give.
STORY: list[tuple[str, status.Observation]] = [
    ("starting", replace(fleet("h1", 0, 0, 0), published=None)),
    ("partly up", fleet("h1", 1, 0)),
    ("serving", replace(fleet("h1", 2, 2), reuse=ReuseStatus(hit_rate=0.8125, hits=13, expired=3,
                                                             recommended_ttl_seconds=540))),
    ("rolling out", replace(fleet("h2", 0, 0), pods=[*pods("prefill", "h1", 2), *pods("decode", "h1", 2),
                                                     *pods("router", None, 1)], published="h1")),
    ("invalid edit", replace(fleet("h2", 2, 2), invalid="spec.prefill.replicas: Input should be greater than or "
                                                       "equal to 0 (got -1)")),
    ("apply failed", replace(fleet("h2", 2, 2), apply_error="PATCH /apis/apps/v1/...: HTTP 403: forbidden")),
    ("pods failing", replace(fleet("h1", 2, 2), pods=[*fleet("h1", 2, 2).pods, CRASHING])),
    ("router down", fleet("h1", 2, 2, 0)),
    ("scaled to zero", fleet("h1", 0, 0, 1, desired=(0, 0, 1))),
]


def cr(namespace: str, name: str = "demo") -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"name": "Qwen/Qwen3-32B"}}}  # fmt: skip


def live_status(api: Api, namespace: str, name: str = "demo") -> dict[str, Any]:
    st: dict[str, Any] = api.get(cr_path(namespace, name)).get("status") or {}
    return st


def test_the_story_has_every_condition_type_and_reason() -> None:
    previous = None
    seen: set[tuple[str, str]] = set()
    for _, obs in STORY:
        previous = status.compute(obs, previous, NOW)
        seen |= {(c.type, c.reason) for c in previous.conditions}
    assert {t for t, _ in seen} == set(status.CONDITION_TYPES)
    reasons = {r for _, r in seen}
    assert {"Serving", "RouterUnavailable", "ScaledToZero", "NoEnginePair", "NoneReady", "PartiallyReady",
            "AllReady", "RollingOut", "Scaling", "Complete", "InvalidSpec", "ApplyFailed", "PodsFailing",
            "EFAUnavailable", "NoFailureReported", "Valid", "AsExpected"} <= reasons  # fmt: skip


def test_every_status_the_operator_computes_is_stored_unchanged(api: Api, kube: Kube, namespace: str) -> None:
    code, body = api.apply(cr(namespace))
    assert code == 201, body
    for i, (step, obs) in enumerate(STORY):
        live = live_status(api, namespace)
        new = status.compute(obs, _previous_status({"status": live}) if live else None, NOW if i < 3 else LATER)
        delta = _status_delta(live, new)  # what reconcile sends: the changed top-level keys
        assert delta, step
        kube.patch_status(namespace, "demo", delta)
        assert live_status(api, namespace) == new.model_dump(by_alias=True, exclude_none=True, mode="json"), step


def test_a_status_write_does_not_touch_the_spec_or_its_generation(api: Api, kube: Kube, namespace: str) -> None:
    code, created = api.apply(cr(namespace))
    assert code == 201, created
    kube.patch_status(namespace, "demo", {"ready": "True"})
    after = api.get(cr_path(namespace, "demo"))
    assert after["spec"] == created["spec"] and after["metadata"]["generation"] == 1
    # the schema's default for conditions applies, as the model's default_factory does
    assert after["status"] == {"ready": "True", "conditions": []}
    code, body = api.request("PATCH", cr_path(namespace, "demo") + "/status", {"spec": {"profile": "benchmark"}},
                             content_type="application/merge-patch+json")  # fmt: skip
    assert code == 200 and body["spec"] == created["spec"]  # the subresource ignores spec


def readme_columns() -> list[str]:
    """The columns README's `kubectl get dinf` line lists after its `#`."""
    line = next(x for x in (ROOT / "README.md").read_text().splitlines() if "kubectl get dinf" in x)
    return line.split("#", 1)[1].split()


def test_kubectl_get_shows_the_columns_the_readme_names(api: Api, kube: Kube, namespace: str) -> None:
    doc = cr(namespace, "qwen3-32b")
    doc["spec"]["kvTransfer"] = {"decoderKvBlocksTtlSeconds": 600, "bidirectional": False}
    assert api.apply(doc)[0] == 201
    kube.patch_status(namespace, "qwen3-32b", status.compute(fleet("h1", 2, 1), None, NOW).model_dump(
        by_alias=True, exclude_none=True, mode="json"))  # fmt: skip
    code, table = api.request("GET", cr_path(namespace), accept=TABLE)
    assert code == 200 and table["kind"] == "Table", table
    shown = [c for c in table["columnDefinitions"] if not c.get("priority")]
    names = [c["name"] for c in shown]
    assert names[0] == "Name" and names[-1] == "Age"
    assert [n.upper() for n in names[1:-1]] == readme_columns()
    wide = [c["name"] for c in table["columnDefinitions"] if c.get("priority")]
    assert wide == ["Hit-Rate", "Released"]  # kubectl get -o wide
    (row,) = table["rows"]
    cells_by_name = dict(zip([c["name"] for c in table["columnDefinitions"]], row["cells"], strict=True))
    name, *cells, age = [cells_by_name[n] for n in names]
    assert name == "qwen3-32b" and re.fullmatch(r"\d+s", age)
    assert cells == ["True", "2/2", "1/2", False, 600, 64]
