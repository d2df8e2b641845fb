"""Keep the Helm chart's copies of the CRD and the RBAC rules equal to their single sources.

- `charts/pdx-operator/crds/disaggregatedinferences.yaml` is byte-for-byte
  `crds/disaggregatedinferences.yaml` (itself generated from the models by `pdx crd --write`).
- `charts/pdx-operator/templates/_generated.tpl` defines the RBAC rules
  (`pdx.controller.rbac`: `rbac_rules()` for all namespaces, `namespaced_rules()` and
  `cluster_scoped_rules()` for watched namespaces), the kopf peering name the handlers use
  (`pdx.controller.rbac.PEERING_NAME`) and the admission policy's resource rules, CEL
  validations and the match condition made of them (`pdx.controller.admission`).
- `charts/pdx-operator/crds/kopf-peering.yaml` holds kopf's peering CRDs as
  `pdx.controller.rbac.peering_manifests()` defines them.

    python scripts/sync_chart.py           # write the copies
    python scripts/sync_chart.py --check   # exit 1 and name the stale files
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "pdx-operator"
CRD_SOURCE = ROOT / "crds" / "disaggregatedinferences.yaml"
CRD_COPY = CHART / "crds" / "disaggregatedinferences.yaml"
GENERATED_TEMPLATE = CHART / "templates" / "_generated.tpl"
PEERING_CRDS = CHART / "crds" / "kopf-peering.yaml"
RBAC_MODULE = "pdx.controller.rbac"
ADMISSION_MODULE = "pdx.controller.admission"
RULES_TEMPLATE = "pdx-operator.rbacRules"
PEERING_TEMPLATE = "pdx-operator.peeringName"


@dataclass(frozen=True)
class OperatorContract:
    """What the chart takes from the operator's code."""

    source: str
    rules: list[dict[str, Any]]
    peering_name: str
    peering_crds: list[dict[str, Any]]
    namespaced_rules: list[dict[str, Any]] = field(default_factory=list)
    cluster_scoped_rules: list[dict[str, Any]] = field(default_factory=list)
    admission_rules: list[dict[str, Any]] = field(default_factory=list)
    admission_validations: list[dict[str, Any]] = field(default_factory=list)
    admission_refused: dict[str, Any] = field(default_factory=dict)


def operator_contract() -> OperatorContract:
    """The operator's own definitions: the chart never writes its RBAC a second time."""
    module = importlib.import_module(RBAC_MODULE)
    admission = importlib.import_module(ADMISSION_MODULE)
    rules_fn = cast(Callable[[], list[dict[str, Any]]], module.rbac_rules)
    manifests_fn = cast(Callable[[], list[dict[str, Any]]], module.peering_manifests)
    namespaced_fn = cast(Callable[[], list[dict[str, Any]]], module.namespaced_rules)
    cluster_fn = cast(Callable[..., list[dict[str, Any]]], module.cluster_scoped_rules)
    crds = [m for m in manifests_fn() if m.get("kind") == "CustomResourceDefinition"]
    return OperatorContract(
        source=RBAC_MODULE,
        rules=rules_fn(),
        peering_name=str(module.PEERING_NAME),
        peering_crds=crds,
        namespaced_rules=namespaced_fn(),
        cluster_scoped_rules=cluster_fn(clusterwide=False),
        admission_rules=cast(Callable[[], list[dict[str, Any]]], admission.resource_rules)(),
        admission_validations=cast(Callable[[], list[dict[str, Any]]], admission.validations)(),
        admission_refused=cast(Callable[[], dict[str, Any]], admission.refused_condition)(),
    )


def _no_delimiters(text: str) -> str:
    if "{{" in text or "}}" in text:
        raise ValueError("generated template content must not contain template delimiters")
    return text


def _yaml(value: Any, flow: bool | None = None) -> str:
    return _no_delimiters(yaml.safe_dump(value, sort_keys=False, default_flow_style=flow, width=100))


def _define(name: str, comment: str, body: str) -> str:
    return f'{{{{/* {comment} */}}}}\n{{{{- define "{name}" -}}}}\n{body}{{{{- end }}}}\n'


def generated_template(contract: OperatorContract) -> str:
    if not contract.rules:
        raise ValueError("no RBAC rules: the operator would be unable to do anything")
    name = _no_delimiters(contract.peering_name)
    parts = [
        _define(RULES_TEMPLATE, "The ClusterRole's rules, all namespaces: rbac_rules().", _yaml(contract.rules)),
        _define(
            PEERING_TEMPLATE, "The kopf peering the handlers join (settings.peering.name): PEERING_NAME.", f"{name}\n"
        ),
    ]
    if contract.namespaced_rules:
        parts += [
            _define(
                "pdx-operator.namespacedRules",
                "The Role's rules in each watched namespace: namespaced_rules().",
                _yaml(contract.namespaced_rules),
            ),
            _define(
                "pdx-operator.clusterScopedRules",
                "The ClusterRole's rules with watched namespaces: cluster_scoped_rules(clusterwide=False).",
                _yaml(contract.cluster_scoped_rules),
            ),
            _define(
                "pdx-operator.admissionResourceRules",
                f"The admission policy's matched kinds and operations: {ADMISSION_MODULE}.resource_rules().",
                _yaml(contract.admission_rules),
            ),
            _define(
                "pdx-operator.admissionValidations",
                f"The admission policy's CEL validations: {ADMISSION_MODULE}.validations().",
                _yaml(contract.admission_validations, flow=False),
            ),
            _define(
                "pdx-operator.admissionRefusedCondition",
                f"The admission policy's match condition of refused writes: {ADMISSION_MODULE}.refused_condition().",
                _yaml([contract.admission_refused], flow=False),
            ),
        ]
    header = f"{{{{/* Generated by scripts/sync_chart.py from {contract.source}; do not edit by hand. */}}}}\n"
    return header + "".join("\n" + p for p in parts)


def peering_crds_yaml(contract: OperatorContract) -> str:
    header = f"# Generated by scripts/sync_chart.py from {contract.source}; do not edit by hand.\n"
    return header + yaml.safe_dump_all(contract.peering_crds, sort_keys=False, width=100)


def expected() -> dict[Path, bytes]:
    """Every file of the chart that is a copy, with the bytes it must hold."""
    contract = operator_contract()
    return {
        CRD_COPY: CRD_SOURCE.read_bytes(),
        GENERATED_TEMPLATE: generated_template(contract).encode(),
        PEERING_CRDS: peering_crds_yaml(contract).encode(),
    }


def stale(files: dict[Path, bytes]) -> list[Path]:
    return [p for p, data in files.items() if not p.is_file() or p.read_bytes() != data]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report copies that differ from their sources")
    args = parser.parse_args(argv)
    files = expected()
    differing = stale(files)
    if args.check:
        for path in differing:
            print(f"stale: {path.relative_to(ROOT)} (run: python scripts/sync_chart.py)", file=sys.stderr)
        return 1 if differing else 0
    for path in differing:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[path])
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
