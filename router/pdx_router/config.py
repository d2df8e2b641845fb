"""The router's configuration: router.json (typed in pdx_contract, shared with the renderer)
plus CLI overrides.

Validation errors name the field and the fix, because the person reading them is usually
looking at a ConfigMap, not at this code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pdx_contract.base import Document, problems
from pdx_contract.router_config import DnsConfig, RouterConfig, StoreConfig, upgraded

__all__ = ["ConfigError", "DnsConfig", "RouterConfig", "StoreConfig", "load_config", "parse_config"]


class ConfigError(ValueError):
    """A config value is wrong; the message says which field and how to fix it."""


def parse_config(raw: str | bytes | Mapping[str, Any]) -> RouterConfig:
    """router.json's text (or its decoded object) as a RouterConfig, or ConfigError."""
    try:
        data = json.loads(raw) if isinstance(raw, str | bytes) else raw
    except ValueError as exc:
        raise ConfigError(f"document: not valid JSON ({exc})") from None
    text = json.dumps(upgraded(data))
    try:
        return check_sources(RouterConfig.model_validate_json(text))
    except ValidationError as err:
        raise ConfigError("; ".join(problems(err))) from None


def check_sources(cfg: RouterConfig) -> RouterConfig:
    """At least one way to find engines must be configured."""
    if not (cfg.prefill or cfg.decode or cfg.endpoints_file or cfg.dns):
        raise ConfigError(
            "prefill/decode: no engines configured; set 'prefill' and 'decode' URLs, "
            "'endpointsFile' or 'dns' (or pass --prefill/--decode)"
        )
    return cfg


def load_config(path: str | Path) -> RouterConfig:
    """Read and validate the JSON file at path."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc.strerror}") from exc
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--config: {path} is not valid JSON ({exc})") from exc
    return parse_config(text)


def with_overrides(cfg: RouterConfig, **changes: Any) -> RouterConfig:
    """Apply CLI overrides (None means 'not given'), validated like the file."""
    wire = cfg.to_json()
    for key, value in changes.items():
        if value is not None:
            wire[RouterConfig.model_fields[key].alias or key] = (
                value.to_json() if isinstance(value, Document) else list(value) if isinstance(value, tuple) else value
            )
    return parse_config(wire)
