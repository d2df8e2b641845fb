"""What the API server does with a CR, done independently of the pydantic models.

Structural defaulting from the CRD's schema, OpenAPI validation with jsonschema, then the
CRD's `x-kubernetes-validations` evaluated by a real CEL engine (cel-python). Tests compare
its verdicts with the models'.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml
from celpy.adapter import json_to_cel

from pdx.rules import KUBERNETES_FUNCTIONS

CRD_PATH = Path(__file__).parents[2] / "crds" / "disaggregatedinferences.yaml"


@cache
def crd() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return doc


def spec_schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Kubernetes structural defaulting: fill absent properties that declare a default."""
    if isinstance(value, dict) and "properties" in schema:
        out = dict(value)
        for name, sub in schema["properties"].items():
            if name not in out and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
            if name in out:
                out[name] = apply_defaults(out[name], sub)
        return out
    if isinstance(value, list) and "items" in schema:
        return [apply_defaults(v, schema["items"]) for v in value]
    return value


def unknown_fields(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """Strict field validation (kubectl's default): fields the schema does not declare."""
    out: list[str] = []
    if isinstance(value, dict) and "properties" in schema:
        for name, sub in value.items():
            if name not in schema["properties"]:
                out.append(f"{path}.{name}")
            else:
                out += unknown_fields(sub, schema["properties"][name], f"{path}.{name}")
    elif isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            out += unknown_fields(v, schema["items"], f"{path}[{i}]")
    return out


def api_server_errors(spec: dict[str, Any]) -> list[str]:
    """Field paths the API server would reject `spec` for (empty: accepted)."""
    schema = spec_schema()
    defaulted = apply_defaults(spec, schema)
    validator = jsonschema.Draft7Validator(schema)
    errors = unknown_fields(spec, schema, "spec")
    for e in validator.iter_errors(defaulted):
        path = "spec" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.absolute_path)
        if e.validator == "required":
            path += "." + e.message.split("'")[1]
        errors.append(path)
    if errors:
        return errors  # the API server stops before CEL when the schema fails
    activation = {"self": json_to_cel(defaulted)}
    for field_path, program in _rules():
        if not bool(program.evaluate(activation)):
            errors.append("spec" + field_path)
    return errors


@cache
def _rules() -> list[tuple[str, Any]]:
    env = celpy.Environment()
    rules = spec_schema().get("x-kubernetes-validations", [])
    # The API server's Kubernetes CEL libraries, as far as the rules use them (quantity()).
    return [(r["fieldPath"], env.program(env.compile(r["rule"]), functions=KUBERNETES_FUNCTIONS)) for r in rules]
