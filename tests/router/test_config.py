"""The operator's config contract and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdx_router.config import ConfigError, parse_config
from pdx_router.main import build_config, parse_args

CONTRACT = {
    "host": "0.0.0.0",
    "port": 8000,
    "servedModelName": "Qwen",
    "generation": "3f2a9c1d0b",
    "prefill": ["http://127.0.0.1:8100"],
    "decode": ["http://[::1]:8200"],
    "endpointsFile": None,
    "dns": None,
    "conversationTtlSeconds": 450,
    "kvRecomputeThreshold": 64,
    "maxEntries": 100000,
    "tenancy": {"identity": "apiKey", "header": None},
    "reuseHeaders": False,
    "store": {"kind": "memory"},
    "maxRequestBytes": 16777216,
    "upstreamTimeoutSeconds": 600,
    "healthCheckIntervalSeconds": 5,
}


def test_contract_example_parses() -> None:
    cfg = parse_config(CONTRACT)
    assert cfg.decode == ("http://[::1]:8200",) and cfg.kv_recompute_threshold == 64
    assert cfg.store.kind == "memory" and cfg.conversation_ttl_seconds == 450


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"port": "8000"}, "port"),
        ({"prefill": ["10.0.0.1:8000"]}, r"prefill\[0\]"),
        ({"store": {"kind": "redis"}}, "store.url"),
        ({"dns": {"prefill": "p"}}, "dns.decode"),
        ({"kvRecomputeThreshold": -1}, "kvRecomputeThreshold"),
        ({"conversationTTL": 3}, "conversationTTL"),
    ],
)
def test_bad_fields_are_named(change: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        parse_config({**CONTRACT, **change})


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "router.json"
    path.write_text(json.dumps(CONTRACT))
    args = parse_args(
        [
            "--config",
            str(path),
            "--prefill",
            "http://[fd00::2]:9",
            "--threshold",
            "16",
            "--redis-url",
            "redis://127.0.0.1:1/0",
        ]
    )
    cfg = build_config(args)
    assert cfg.prefill == ("http://[fd00::2]:9",) and cfg.decode == ("http://[::1]:8200",)
    assert cfg.kv_recompute_threshold == 16 and cfg.store.kind == "redis"


def test_bad_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "router.json"
    path.write_text(json.dumps({**CONTRACT, "store": {"kind": "etcd"}}))
    proc = subprocess.run(
        [sys.executable, "-m", "pdx_router.main", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "store.kind" in proc.stderr
