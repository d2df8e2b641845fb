"""Keep the Helm chart's copies of the CRD and the RBAC rules equal to their single sources.

- `charts/pdx-operator/crds/disaggregatedinferences.yaml` is byte-for-byte
  `crds/disaggregatedinferences.yaml` (itself generated from the models by `pdx crd --write`).
- `charts/pdx-operator/templates/_generated.tpl` defines the ClusterRole's rules
  (`pdx.controller.rbac.rbac_rules()`) and the kopf peering name the handlers use
  (`pdx.controller.rbac.PEERING_NAME`).
- `charts/pdx-operator/crds/kopf-peering.yaml` holds kopf's peering CRDs as
  `pdx.controller.rbac.peering_manifests()` defines them.

Without `pdx.controller.rbac` (an older tree), the stand-ins below are used and the generated
files name them as their source.

    python scripts/sync_chart.py           # write the copies
    python scripts/sync_chart.py --check   # exit 1 and name the stale files
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
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
RULES_TEMPLATE = "pdx-operator.rbacRules"
PEERING_TEMPLATE = "pdx-operator.peeringName"
FALLBACK_PEERING_NAME = "pdx-operator"

_CRUD = ["get", "list", "watch", "create", "update", "patch", "delete"]

# Stand-in when pdx.controller.rbac is absent: the verbs a kopf operator reconciling the
# DisaggregatedInference children needs, and kopf's own needs (peering, events, discovery).
FALLBACK_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": ["inference.pdx.dev"],
        "resources": ["disaggregatedinferences"],
        "verbs": ["get", "list", "watch", "patch", "update"],
    },
    {
        "apiGroups": ["inference.pdx.dev"],
        "resources": ["disaggregatedinferences/status"],
        "verbs": ["get", "patch", "update"],
    },
    {"apiGroups": ["apps"], "resources": ["statefulsets", "deployments"], "verbs": _CRUD},
    {"apiGroups": [""], "resources": ["services", "configmaps"], "verbs": _CRUD},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": _CRUD},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": _CRUD},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    {
        "apiGroups": ["kopf.dev"],
        "resources": ["clusterkopfpeerings", "kopfpeerings"],
        "verbs": ["get", "list", "watch", "patch"],
    },
    {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "verbs": ["list", "watch"],
    },
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
]


def _fallback_peering_crd(kind: str, plural: str, scope: str) -> dict[str, Any]:
    status = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    version = {
        "name": "v1",
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": {"type": "object", "properties": {"status": status}}},
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.kopf.dev"},
        "spec": {
            "scope": scope,
            "group": "kopf.dev",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [version],
        },
    }


@dataclass(frozen=True)
class OperatorContract:
    """What the chart takes from the operator's code."""

    source: str
    rules: list[dict[str, Any]]
    peering_name: str
    peering_crds: list[dict[str, Any]]


def operator_contract() -> OperatorContract:
    """The operator's definitions when its module exists, the stand-ins otherwise."""
    try:
        module = importlib.import_module(RBAC_MODULE)
    except ModuleNotFoundError as err:
        if err.name is None or not RBAC_MODULE.startswith(err.name):
            raise
        return OperatorContract(
            source="the stand-ins of scripts/sync_chart.py",
            rules=FALLBACK_RULES,
            peering_name=FALLBACK_PEERING_NAME,
            peering_crds=[
                _fallback_peering_crd("ClusterKopfPeering", "clusterkopfpeerings", "Cluster"),
                _fallback_peering_crd("KopfPeering", "kopfpeerings", "Namespaced"),
            ],
        )
    rules_fn = cast(Callable[[], list[dict[str, Any]]], module.rbac_rules)
    manifests_fn = cast(Callable[[], list[dict[str, Any]]], module.peering_manifests)
    crds = [m for m in manifests_fn() if m.get("kind") == "CustomResourceDefinition"]
    return OperatorContract(
        source=RBAC_MODULE,
        rules=rules_fn(),
        peering_name=str(module.PEERING_NAME),
        peering_crds=crds,
    )


def _no_delimiters(text: str) -> str:
    if "{{" in text or "}}" in text:
        raise ValueError("generated template content must not contain template delimiters")
    return text


def generated_template(contract: OperatorContract) -> str:
    if not contract.rules:
        raise ValueError("no RBAC rules: the operator would be unable to do anything")
    rules = _no_delimiters(yaml.safe_dump(contract.rules, sort_keys=False, default_flow_style=None, width=100))
    name = _no_delimiters(contract.peering_name)
    return (
        f"{{{{/* Generated by scripts/sync_chart.py from {contract.source}; do not edit by hand. */}}}}\n"
        "\n"
        "{{/* The ClusterRole's rules: rbac_rules(). */}}\n"
        f'{{{{- define "{RULES_TEMPLATE}" -}}}}\n'
        f"{rules}"
        "{{- end }}\n"
        "\n"
        "{{/* The kopf peering the handlers join (settings.peering.name): PEERING_NAME. */}}\n"
        f'{{{{- define "{PEERING_TEMPLATE}" -}}}}\n'
        f"{name}\n"
        "{{- end }}\n"
    )


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
