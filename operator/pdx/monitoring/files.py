"""The committed copies of the rules and the dashboard, generated from `alerts` and `dashboard`.

They live in the chart (files/), which ships them as an optional PrometheusRule and Grafana
ConfigMap; a plain Prometheus loads the rules file directly (rule_files:).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from pdx.monitoring.alerts import rules_file
from pdx.monitoring.dashboard import dashboard

ROOT = Path(__file__).resolve().parents[3]
FILES = ROOT / "charts" / "pdx-operator" / "files"
RULES = FILES / "pdx-alerts.yaml"
DASHBOARD = FILES / "pdx-dashboard.json"
HEADER = "# Generated from operator/pdx/monitoring (python -m pdx.monitoring --write); do not edit.\n"


class _Dumper(yaml.SafeDumper):
    """Multi-line expressions as literal blocks, so the file reads like a hand-written one."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def expected() -> dict[Path, bytes]:
    rules = HEADER + yaml.dump(rules_file(), Dumper=_Dumper, sort_keys=False, width=200)
    return {RULES: rules.encode(), DASHBOARD: (json.dumps(dashboard(), indent=2) + "\n").encode()}


def stale() -> list[Path]:
    return [p for p, data in expected().items() if not p.exists() or p.read_bytes() != data]


def write() -> list[Path]:
    changed = stale()
    for path, data in expected().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return changed
