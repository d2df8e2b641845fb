"""The operator's own /metrics: every pass counted by result, and the failures a person must see."""

from __future__ import annotations

import types
import urllib.request
from collections.abc import Mapping
from typing import Any

from pdx.controller import handlers, metrics
from pdx.controller.kube import ApiError, Kube
from pdx.controller.state import ListReads
from pdx.local.topology import free_port
from tests.operator.conftest import ApiServer, cr_document, create_cr, in_thread


def _count(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


class RefusingSets(Kube):
    """The API refusing every StatefulSet apply (a quota, an admission webhook)."""

    def apply(self, obj: Mapping[str, Any], field_manager: str | None = None) -> dict[str, Any]:
        if obj["kind"] == "StatefulSet":
            raise ApiError(422, "PATCH", obj["metadata"]["name"], "refused")
        return super().apply(obj, field_manager)


def _one_pass(kube: Kube, name: str) -> None:
    """A pass as the operator runs it in its pool: from a snapshot of the resource's state."""
    snap = ListReads(kube).read("inference", name)
    assert snap is not None
    handlers._work(types.SimpleNamespace(kube=kube), handlers._Gate(), "inference", name, snap, False, False)


async def test_passes_are_counted_by_result_and_refused_applies_as_errors(api: ApiServer, kube: Kube) -> None:
    before = {r: _count("pdx_operator_reconcile_passes_total", result=r) for r in metrics.RESULTS}
    errors = _count("pdx_operator_reconcile_errors_total", reason="apply")
    await create_cr(api, cr_document())
    for _ in range(2):  # the first writes the children, the second finds nothing to do
        await in_thread(_one_pass, kube, "demo")
    await create_cr(api, cr_document("other", decode={"replicas": -1}))  # refused by the models
    await in_thread(_one_pass, kube, "other")
    after = {r: _count("pdx_operator_reconcile_passes_total", result=r) for r in metrics.RESULTS}
    assert {r: after[r] - before[r] for r in metrics.RESULTS} == {
        "idle": 1, "wrote": 1, "invalid": 1, "failed": 0, "gone": 0
    }  # fmt: skip
    await create_cr(api, cr_document("third"))
    await in_thread(_one_pass, RefusingSets(kube.api), "third")
    assert _count("pdx_operator_reconcile_errors_total", reason="apply") == errors + 1
    assert _count("pdx_operator_reconcile_passes_total", result="failed") == after["failed"] + 1


def test_metrics_are_served_on_the_charts_port_and_only_when_it_is_set() -> None:
    assert metrics.serve({}) is None
    port = free_port()
    assert metrics.serve({"PDX_METRICS_PORT": str(port)}) == port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert "pdx_operator_reconcile_passes_total" in text and "pdx_operator_reconcile_seconds_bucket" in text
