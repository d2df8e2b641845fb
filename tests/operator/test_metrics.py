"""The operator's own /metrics: every pass counted by result, and the failures a person must see."""

from __future__ import annotations

import logging
import types
import urllib.request
from collections.abc import Mapping
from typing import Any

import pytest

from pdx.controller import handlers, metrics
from pdx.controller.kube import ApiError, Kube
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


async def test_passes_are_counted_by_result_and_refused_applies_as_errors(
    api: ApiServer, kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handlers, "_post", lambda outcome: None)  # events need kopf's context
    memo = types.SimpleNamespace(kube=kube)
    log = logging.getLogger("test")
    before = {r: _count("pdx_operator_reconcile_passes_total", result=r) for r in metrics.RESULTS}
    errors = _count("pdx_operator_reconcile_errors_total", reason="apply")
    await create_cr(api, cr_document())
    for _ in range(2):  # the first writes the children, the second finds nothing to do
        await in_thread(handlers._pass, memo, "inference", "demo", stats=False, wait=True, logger=log)
    await in_thread(handlers._pass, memo, "inference", "nobody", stats=False, wait=True, logger=log)
    after = {r: _count("pdx_operator_reconcile_passes_total", result=r) for r in metrics.RESULTS}
    assert {r: after[r] - before[r] for r in metrics.RESULTS} == {
        "idle": 1, "wrote": 1, "invalid": 0, "failed": 0, "gone": 1
    }  # fmt: skip
    await create_cr(api, cr_document("other"))
    refusing = types.SimpleNamespace(kube=RefusingSets(kube.api))
    await in_thread(handlers._pass, refusing, "inference", "other", stats=False, wait=True, logger=log)
    assert _count("pdx_operator_reconcile_errors_total", reason="apply") == errors + 1


def test_metrics_are_served_on_the_charts_port_and_only_when_it_is_set() -> None:
    assert metrics.serve({}) is None
    port = free_port()
    assert metrics.serve({"PDX_METRICS_PORT": str(port)}) == port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert "pdx_operator_reconcile_passes_total" in text and "pdx_operator_reconcile_seconds_bucket" in text
