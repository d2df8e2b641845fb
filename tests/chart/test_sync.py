"""The chart's copies of the CRD, the RBAC rules and the peering CRDs equal their sources."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.chart import load_sync_chart

ROOT = Path(__file__).resolve().parents[2]
sync_chart = load_sync_chart()


def test_chart_crd_is_byte_for_byte_the_generated_crd() -> None:
    assert sync_chart.CRD_COPY.read_bytes() == sync_chart.CRD_SOURCE.read_bytes()


def test_no_chart_copy_is_stale() -> None:
    assert sync_chart.stale(sync_chart.expected()) == []


def test_check_mode_exits_zero_when_in_sync() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sync_chart.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_a_changed_copy_is_reported_stale(tmp_path: Path) -> None:
    copy = tmp_path / "crd.yaml"
    copy.write_bytes(sync_chart.CRD_SOURCE.read_bytes() + b"# hand edit\n")
    missing = tmp_path / "absent.yaml"
    same = tmp_path / "same.yaml"
    same.write_bytes(b"x")
    assert sync_chart.stale({copy: sync_chart.CRD_SOURCE.read_bytes(), missing: b"", same: b"x"}) == [copy, missing]


def test_rules_come_from_the_operators_rbac_module_when_present() -> None:
    from pdx.controller import rbac

    contract = sync_chart.operator_contract()
    assert contract.source == "pdx.controller.rbac"
    assert contract.rules == rbac.rbac_rules()
    assert contract.peering_name == rbac.PEERING_NAME


def test_generated_template_defines_the_rules_as_yaml() -> None:
    contract = sync_chart.operator_contract()
    text = sync_chart.generated_template(contract)
    body = text.split('{{- define "pdx-operator.rbacRules" -}}\n', 1)[1].split("{{- end }}", 1)[0]
    assert yaml.safe_load(body) == contract.rules


def test_template_delimiters_in_rules_are_refused() -> None:
    contract = sync_chart.OperatorContract(
        source="test", rules=[{"apiGroups": ["{{ .x }}"]}], peering_name="p", peering_crds=[]
    )
    with pytest.raises(ValueError, match="delimiters"):
        sync_chart.generated_template(contract)


def test_peering_name_in_the_chart_is_the_one_the_handlers_join() -> None:
    from pdx.controller import rbac

    text = sync_chart.GENERATED_TEMPLATE.read_text()
    assert f'{{{{- define "pdx-operator.peeringName" -}}}}\n{rbac.PEERING_NAME}\n' in text
