"""A DisaggregatedInference as the renderer sees it: identity plus a validated spec.

Loading turns a raw custom-resource document into this, or raises `SpecError` with messages
that name the field and the fix, so `pdx render`, the local runtime and the operator report
bad input the same way.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pdx.rules import DNS_LABEL, MAX_NAME_LENGTH, NAME_PROBLEM
from pdx.spec import API_VERSION, KIND, DisaggregatedInferenceSpec


class _ManifestLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping, as kubectl's reader does
    (PyYAML's own keeps the last one silently, so a file kubectl refuses would render)."""


def _mapping(loader: _ManifestLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_ManifestLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def manifest_documents(text: str) -> list[Any]:
    """The non-empty YAML documents of a manifest, read as kubectl reads them (raises yaml.YAMLError)."""
    return [d for d in yaml.load_all(text, Loader=_ManifestLoader) if d is not None]


class SpecError(ValueError):
    """Invalid DisaggregatedInference; `problems` are one line each: `field: what to do`."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Target:
    """What to render: the resource's identity and its validated spec."""

    name: str
    namespace: str
    spec: DisaggregatedInferenceSpec
    uid: str | None = None
    generation: int | None = None


def _field(loc: tuple[int | str, ...]) -> str:
    """The field path as the API server writes it: `spec.kvTransfer.backends[0]`."""
    return "spec" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)


def _problems(err: ValidationError) -> list[str]:
    out = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "value_error" and not e["loc"]:
            out.extend(msg.split("; "))  # cross-field rules already name their fields
        elif e["type"] == "extra_forbidden":
            out.append(
                f"{_field(e['loc'])}: unknown field; remove it or fix its spelling (see `kubectl explain dinf.spec`)"
            )
        elif e["type"] == "missing":  # its input is the enclosing object, not worth echoing
            out.append(f"{_field(e['loc'])}: {msg}")
        else:
            out.append(f"{_field(e['loc'])}: {msg} (got {e.get('input')!r})")
    return out


@cache
def _spec_schema() -> dict[str, Any]:
    from pdx.crd import spec_schema

    return spec_schema()


def decoded(value: Any, schema: dict[str, Any]) -> Any:
    """`value` as the API server reads it before validating: a null in a field of the schema is
    dropped (then defaulted), and a whole number where the schema has an integer is one (2.0).
    Fields the schema does not know, and free-form objects, are left as they are."""
    if isinstance(value, dict):
        props: dict[str, Any] = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        if not props and not isinstance(extra, dict):
            return value
        out = {}
        for key, item in value.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is None:
                out[key] = item  # unknown: the models refuse it by name
            elif item is not None:
                out[key] = decoded(item, sub)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [decoded(item, schema["items"]) for item in value]
    if schema.get("type") == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def parse_spec(raw: Any) -> DisaggregatedInferenceSpec:
    try:
        return DisaggregatedInferenceSpec.model_validate(decoded(raw, _spec_schema()))
    except ValidationError as err:
        raise SpecError(_problems(err)) from None


def load(document: dict[str, Any], default_namespace: str = "default") -> Target:
    """Validate a whole custom-resource document (as `kubectl apply` would send it)."""
    problems: list[str] = []
    if document.get("apiVersion") != API_VERSION or document.get("kind") != KIND:
        problems.append(
            f"apiVersion/kind: expected {API_VERSION} {KIND}, got {document.get('apiVersion')} {document.get('kind')}"
        )
    meta = document.get("metadata") or {}
    name = meta.get("name", "")
    if not isinstance(name, str) or not re.fullmatch(DNS_LABEL, name) or len(name) > MAX_NAME_LENGTH:
        problems.append(f"metadata.name: '{name}' {NAME_PROBLEM}")  # the CRD's NAME_RULE says the same
    if "spec" not in document:
        problems.append("spec: missing; a DisaggregatedInference needs at least spec.model.name")
    if problems:
        raise SpecError(problems)
    spec = parse_spec(document["spec"])
    return Target(
        name=name,
        namespace=meta.get("namespace") or default_namespace,
        spec=spec,
        uid=meta.get("uid"),
        generation=meta.get("generation"),
    )


def read_target(path: str) -> Target:
    """Load one DisaggregatedInference from a YAML file (or `-` for stdin)."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    try:
        docs = manifest_documents(text)  # a duplicate key is an error, as in kubectl
    except yaml.YAMLError as err:
        raise SpecError([f"{path}: not valid YAML: {err}"]) from None
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise SpecError([f"{path}: expected exactly one DisaggregatedInference document, found {len(docs)}"])
    return load(docs[0])
