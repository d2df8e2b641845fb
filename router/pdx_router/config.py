"""The router's configuration: the JSON contract the operator renders, plus CLI overrides.

Validation errors name the field and the fix, because the person reading them is usually
looking at a ConfigMap, not at this code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


class ConfigError(ValueError):
    """A config value is wrong; the message says which field and how to fix it."""


@dataclass(frozen=True)
class DnsConfig:
    prefill: str
    decode: str
    port: int = 8000
    refresh_seconds: float = 5.0


@dataclass(frozen=True)
class StoreConfig:
    kind: str = "memory"
    url: str | None = None
    key_prefix: str = "pdx:"


@dataclass(frozen=True)
class RouterConfig:
    host: str = "0.0.0.0"
    port: int = 8000
    served_model_name: str = "default"
    generation: str = "default"
    prefill: tuple[str, ...] = ()
    decode: tuple[str, ...] = ()
    endpoints_file: str | None = None
    dns: DnsConfig | None = None
    conversation_ttl_seconds: float = 450.0
    kv_recompute_threshold: int = 64
    max_entries: int = 100_000
    tenant_header: str | None = None
    store: StoreConfig = field(default_factory=StoreConfig)
    max_request_bytes: int = 16 * 1024 * 1024
    upstream_timeout_seconds: float = 600.0
    health_check_interval_seconds: float = 5.0
    # The model directory (tokenizer.json, tokenizer_config.json) the engines serve: reused
    # chat turns are then tokenized here instead of by a /tokenize call to the engine.
    tokenizer: str | None = None


def normalize_url(value: object, where: str) -> str:
    """Check an engine base URL (IPv6 literals in brackets are fine) and drop a trailing '/'."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a URL string like 'http://10.0.0.5:8000'")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"{where}: {value!r} is not an http(s) URL; write e.g. 'http://10.0.0.5:8000' "
            "or 'http://[fd00::5]:8000' for IPv6"
        )
    try:
        host, _ = parts.hostname, parts.port
    except ValueError as exc:
        raise ConfigError(f"{where}: {value!r} has a bad port ({exc})") from exc
    if not host:
        raise ConfigError(f"{where}: {value!r} has no host")
    if ":" in host and "[" not in parts.netloc:
        raise ConfigError(f"{where}: IPv6 literal in {value!r} must be in brackets: http://[{host}]:PORT")
    return value.rstrip("/")


def _get(raw: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    if key not in raw or raw[key] is None:
        return default
    value = raw[key]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ConfigError(f"{key}: expected {_kind_name(kind)}, got a boolean")
    if not isinstance(value, kind):
        raise ConfigError(f"{key}: expected {_kind_name(kind)}, got {type(value).__name__} {value!r}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _positive(key: str, value: float) -> float:
    if value <= 0:
        raise ConfigError(f"{key}: must be > 0, got {value}")
    return value


_KNOWN = {
    "host",
    "port",
    "servedModelName",
    "generation",
    "prefill",
    "decode",
    "endpointsFile",
    "dns",
    "conversationTtlSeconds",
    "kvRecomputeThreshold",
    "maxEntries",
    "tenantHeader",
    "store",
    "maxRequestBytes",
    "upstreamTimeoutSeconds",
    "healthCheckIntervalSeconds",
    "tokenizer",
}


def parse_config(raw: Mapping[str, Any]) -> RouterConfig:
    """Turn the operator's JSON object into a RouterConfig, or raise ConfigError."""
    if not isinstance(raw, Mapping):
        raise ConfigError("config: expected a JSON object at the top level")
    unknown = sorted(set(raw) - _KNOWN)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown field; known fields are {sorted(_KNOWN)}")
    port = _get(raw, "port", int, 8000)
    if not 0 < port < 65536:
        raise ConfigError(f"port: must be 1..65535, got {port}")
    urls: dict[str, tuple[str, ...]] = {}
    for role in ("prefill", "decode"):
        items = _get(raw, role, list, [])
        urls[role] = tuple(normalize_url(u, f"{role}[{i}]") for i, u in enumerate(items))
    dns_raw = _get(raw, "dns", dict, None)
    dns = None
    if dns_raw is not None:
        for key in ("prefill", "decode"):
            if not isinstance(dns_raw.get(key), str) or not dns_raw[key]:
                raise ConfigError(f"dns.{key}: expected the headless Service DNS name")
        dport = dns_raw.get("port", 8000)
        if isinstance(dport, bool) or not isinstance(dport, int) or not 0 < dport < 65536:
            raise ConfigError(f"dns.port: expected a port number, got {dport!r}")
        refresh = dns_raw.get("refreshSeconds", 5)
        if isinstance(refresh, bool) or not isinstance(refresh, int | float) or refresh <= 0:
            raise ConfigError(f"dns.refreshSeconds: expected a number > 0, got {refresh!r}")
        dns = DnsConfig(dns_raw["prefill"], dns_raw["decode"], dport, float(refresh))
    store_raw = _get(raw, "store", dict, {"kind": "memory"})
    kind = store_raw.get("kind", "memory")
    if kind not in ("memory", "redis"):
        raise ConfigError(f"store.kind: expected 'memory' or 'redis', got {kind!r}")
    store_url = store_raw.get("url")
    if kind == "redis" and (
        not isinstance(store_url, str) or not store_url.startswith(("redis://", "rediss://", "unix://"))
    ):
        raise ConfigError("store.url: kind 'redis' needs a URL like 'redis://host:6379/0'")
    prefix = store_raw.get("keyPrefix", "pdx:")
    if not isinstance(prefix, str):
        raise ConfigError("store.keyPrefix: expected a string")
    threshold = _get(raw, "kvRecomputeThreshold", int, 64)
    if threshold < 0:
        raise ConfigError(f"kvRecomputeThreshold: must be >= 0, got {threshold}")
    max_entries = _get(raw, "maxEntries", int, 100_000)
    if max_entries < 1:
        raise ConfigError(f"maxEntries: must be >= 1, got {max_entries}")
    endpoints_file = _get(raw, "endpointsFile", str, None)
    cfg = RouterConfig(
        host=_get(raw, "host", str, "0.0.0.0"),
        port=port,
        served_model_name=_get(raw, "servedModelName", str, "default"),
        generation=_get(raw, "generation", str, "default"),
        prefill=urls["prefill"],
        decode=urls["decode"],
        endpoints_file=endpoints_file,
        dns=dns,
        conversation_ttl_seconds=_positive(
            "conversationTtlSeconds", float(_get(raw, "conversationTtlSeconds", (int, float), 450))
        ),
        kv_recompute_threshold=threshold,
        max_entries=max_entries,
        tenant_header=_get(raw, "tenantHeader", str, None),
        store=StoreConfig(kind, store_url, prefix),
        max_request_bytes=int(_positive("maxRequestBytes", _get(raw, "maxRequestBytes", int, 16 * 1024 * 1024))),
        upstream_timeout_seconds=_positive(
            "upstreamTimeoutSeconds", float(_get(raw, "upstreamTimeoutSeconds", (int, float), 600))
        ),
        health_check_interval_seconds=_positive(
            "healthCheckIntervalSeconds",
            float(_get(raw, "healthCheckIntervalSeconds", (int, float), 5)),
        ),
        tokenizer=_get(raw, "tokenizer", str, None),
    )
    return check_sources(cfg)


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
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--config: {path} is not valid JSON ({exc})") from exc
    return parse_config(raw)


def with_overrides(cfg: RouterConfig, **changes: Any) -> RouterConfig:
    """Apply CLI overrides (None means 'not given'), re-validating URLs."""
    given = {k: v for k, v in changes.items() if v is not None}
    for role in ("prefill", "decode"):
        if role in given:
            given[role] = tuple(normalize_url(u, f"--{role}") for u in given[role])
    return check_sources(replace(cfg, **given))
