"""A fleet stamped from one template validates its spec once, not once per resource."""

from __future__ import annotations

from typing import Any

import pytest

from pdx.controller import reconcile
from pdx.resource import SpecError
from tests.operator.conftest import cr_document


def test_one_spec_is_validated_once_across_names_and_bad_names_still_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    from pdx.resource import load as real

    def counting(doc: dict[str, Any], default_namespace: str = "default") -> Any:
        calls.append(doc["metadata"]["name"])
        return real(doc, default_namespace=default_namespace)

    monkeypatch.setattr(reconcile, "load", counting)
    monkeypatch.setattr(reconcile, "_specs", type(reconcile._specs)())
    spec: dict[str, Any] = {"model": {"name": "Qwen/Qwen3-32B"}, "decode": {"replicas": 3}}
    targets = [reconcile.load_target(cr_document(name=f"fleet-{i}", **spec), "inference") for i in range(5)]
    assert [t.name for t in targets] == [f"fleet-{i}" for i in range(5)]
    assert calls == ["fleet-0"]
    with pytest.raises(SpecError, match=r"metadata\.name"):
        reconcile.load_target(cr_document(name="Not_A_Name", **spec), "inference")
    bad = cr_document(name="fleet-9", decode={"replicas": -1})
    for _ in range(2):
        with pytest.raises(SpecError, match="decode"):
            reconcile.load_target(bad, "inference")
    assert calls == ["fleet-0", "Not_A_Name", "fleet-9"]  # the invalid spec's verdict is kept too
