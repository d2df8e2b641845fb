"""The chart's rules file and dashboard are the ones operator/pdx/monitoring generates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pdx.monitoring import __main__ as cli
from pdx.monitoring import alerts, dashboard, files


def test_committed_rules_and_dashboard_equal_the_generated_ones() -> None:
    assert files.stale() == [], "run: python -m pdx.monitoring --write"


def test_rules_file_is_the_prometheus_rules_spec() -> None:
    doc = yaml.safe_load(files.expected()[files.RULES])
    assert doc == alerts.prometheus_rule("monitoring")["spec"]
    assert [r["alert"] for r in doc["groups"][0]["rules"]] == [a.name for a in alerts.ALERTS]


def test_every_alert_says_what_to_change() -> None:
    for a in alerts.ALERTS:
        assert "spec." in a.description or "kubectl" in a.description, a.name
    expired = next(a for a in alerts.ALERTS if a.name == "PdxReuseReadsExpiredOrDeclined")
    assert "status.reuse.recommendedTtlSeconds" in expired.description


def test_dashboard_panels_carry_the_modules_queries() -> None:
    doc = json.loads(files.expected()[files.DASHBOARD])
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    assert exprs == dashboard.queries()
    assert len({p["id"] for p in doc["panels"]}) == len(doc["panels"])


def test_check_reports_a_hand_edited_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    edited = tmp_path / "pdx-alerts.yaml"
    edited.write_bytes(files.expected()[files.RULES] + b"# hand edit\n")
    monkeypatch.setattr(files, "RULES", edited)
    monkeypatch.setattr(files, "DASHBOARD", tmp_path / "absent.json")
    monkeypatch.setattr(files, "ROOT", tmp_path)
    assert files.stale() == [edited, tmp_path / "absent.json"]
    assert cli.main(["--check"]) == 1
    assert cli.main(["--write"]) == 0
    assert files.stale() == []


def test_every_alerts_signals_are_parts_of_its_expression() -> None:
    for a in alerts.ALERTS:
        assert a.signals, a.name
        for signal in a.signals:
            assert signal in a.expr, f"{a.name}: {signal}"
