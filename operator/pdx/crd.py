"""The CustomResourceDefinition, generated from the pydantic models.

`pdx crd > crds/disaggregatedinferences.yaml` writes the committed file; a test fails when
the two differ, so the CRD cannot drift from the models.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from pdx import labels, rules, spec

CRD_FILE = "crds/disaggregatedinferences.yaml"

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Ready", "type": "string", "jsonPath": ".status.ready"},
    {"name": "Prefill", "type": "string", "jsonPath": ".status.prefill.summary"},
    {"name": "Decode", "type": "string", "jsonPath": ".status.decode.summary"},
    {"name": "Bidirectional", "type": "boolean", "jsonPath": ".spec.kvTransfer.bidirectional"},
    {"name": "TTL", "type": "integer", "jsonPath": ".spec.kvTransfer.decoderKvBlocksTtlSeconds"},
    {"name": "Threshold", "type": "integer", "jsonPath": ".spec.kvTransfer.kvRecomputeThreshold"},
    # kubectl get -o wide: reuse, and returning turns whose held KV decode released under pressure
    {"name": "Hit-Rate", "type": "number", "jsonPath": ".status.reuse.hitRate", "priority": 1},
    {"name": "Released", "type": "integer", "jsonPath": ".status.reuse.released", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _models(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every model class reachable from `root`, by the name pydantic uses in $defs."""
    found: dict[str, type[BaseModel]] = {}
    todo: list[type[BaseModel]] = [root]
    while todo:
        model = todo.pop()
        if model.__name__ in found:
            continue
        found[model.__name__] = model
        for info in model.model_fields.values():
            for arg in _types_in(info.annotation):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    todo.append(arg)
    return found


def _types_in(annotation: Any) -> list[Any]:
    args = getattr(annotation, "__args__", None)
    if not args:
        return [annotation]
    out = []
    for a in args:
        out.extend(_types_in(a))
    return out


def _factory_default(info: FieldInfo) -> Any:
    """The JSON default of a default_factory field, so API-server defaulting matches the models."""
    value = info.default_factory() if info.default_factory else None  # type: ignore[call-arg]
    if isinstance(value, BaseModel):
        return value.model_dump(by_alias=True, exclude_none=True, mode="json")
    if isinstance(value, list):
        return [
            v.model_dump(by_alias=True, exclude_none=True, mode="json") if isinstance(v, BaseModel) else v
            for v in value
        ]
    return value


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    """pydantic JSON schema -> Kubernetes structural schema (refs inlined, no nulls, no titles)."""
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[1]])
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return _structural({**target, **rest}, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if len(options) == 1:
            return _structural({**options[0], **rest}, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "$defs"):
            continue
        if key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            # JSON Schema's numeric bound; OpenAPI v3.0 (Kubernetes) has the bound plus a flag
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "properties":
            out[key] = {k: _structural(v, defs) for k, v in value.items()}
        elif key == "additionalProperties":
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif value is not False:
                out[key] = _structural(value, defs)
        elif key == "default" and value is None:
            continue
        else:
            out[key] = _structural(value, defs)
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def model_schema(root: type[BaseModel]) -> dict[str, Any]:
    """Structural openAPIV3Schema of a model, with factory defaults filled in."""
    raw = root.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    for name, model in _models(root).items():
        target = defs.get(name) if name != root.__name__ else raw
        if target is None:
            continue
        if model.__doc__:
            target["description"] = " ".join(model.__doc__.split())
        for field_name, info in model.model_fields.items():
            if info.default_factory is not None:
                alias = info.alias or field_name
                target["properties"][alias]["default"] = _factory_default(info)
    schema: dict[str, Any] = _prose(_structural(raw, defs))
    return schema


def _prose(node: Any) -> Any:
    """Descriptions as paragraphs: a docstring's line breaks are not the reader's (kubectl
    explain wraps the text itself); blank lines still part paragraphs."""
    if isinstance(node, list):
        return [_prose(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _prose(v) for k, v in node.items()}
    if isinstance(out.get("description"), str):
        out["description"] = "\n\n".join(" ".join(p.split()) for p in out["description"].split("\n\n"))
    return out


def spec_schema() -> dict[str, Any]:
    schema = model_schema(spec.DisaggregatedInferenceSpec)
    schema["x-kubernetes-validations"] = [r.to_crd() for r in rules.RULES]
    return schema


def crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition object."""
    status = model_schema(spec.DisaggregatedInferenceStatus)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{spec.PLURAL}.{spec.GROUP}",
            "labels": {labels.PART_OF: labels.APP},
        },
        "spec": {
            "group": spec.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": spec.KIND,
                "plural": spec.PLURAL,
                "singular": spec.SINGULAR,
                "shortNames": spec.SHORT_NAMES,
                "categories": ["pdx"],
            },
            "versions": [
                {
                    "name": spec.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": spec.DisaggregatedInferenceSpec.__doc__ or "",
                            "required": ["spec"],
                            "x-kubernetes-validations": [rules.NAME_RULE],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                # name declared so NAME_RULE may point at it (its fieldPath)
                                "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
                                "spec": spec_schema(),
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated from operator/pdx/spec.py by `pdx crd`; do not edit by hand.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=100)
