"""tests.support.vllm_cli really uses vLLM's parser: good argv in, vLLM objects out; bad argv out."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("vllm", reason="needs the engine extra (scripts/setup.sh)")

from tests.support.vllm_cli import VllmArgsError, parse_serve_args

KV: dict[str, Any] = {
    "kv_connector": "NixlConnector",
    "kv_role": "kv_producer",
    "kv_buffer_device": "cpu",
    "engine_id": "prefill-0",
    "kv_load_failure_policy": "fail",
    "kv_connector_extra_config": {
        "backends": ["UCX"],
        "bidirectional_kv_xfer": True,
        "decoder_kv_blocks_ttl": 480,
        "kv_recompute_threshold": 64,
    },
}


def good_argv(kv: dict[str, Any] = KV) -> list[str]:
    return [
        "/models/does-not-exist",
        "--load-format", "dummy",
        "--enforce-eager",
        "--dtype", "float32",
        "--port", "8100",
        "--no-enable-prefix-caching",
        "--kv-transfer-config", json.dumps(kv),
    ]


def test_good_argv_builds_vllm_objects() -> None:
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs

    engine_args, kv = parse_serve_args(good_argv())
    assert isinstance(engine_args, EngineArgs)
    assert engine_args.model == "/models/does-not-exist"
    assert engine_args.load_format == "dummy"
    assert engine_args.enforce_eager is True
    assert engine_args.dtype == "float32"
    assert engine_args.enable_prefix_caching is False
    assert isinstance(kv, KVTransferConfig)
    assert kv.kv_connector == "NixlConnector"
    assert kv.kv_role == "kv_producer"
    assert kv.kv_buffer_device == "cpu"
    assert kv.engine_id == "prefill-0"
    assert kv.kv_load_failure_policy == "fail"
    assert kv.kv_connector_extra_config["bidirectional_kv_xfer"] is True
    assert kv.is_kv_producer and not kv.is_kv_consumer


def test_consumer_role_and_no_kv_config() -> None:
    _, kv = parse_serve_args(good_argv({**KV, "kv_role": "kv_consumer", "engine_id": "decode-0"}))
    assert kv.is_kv_consumer and not kv.is_kv_producer
    engine_args, none = parse_serve_args(["/m", "--enforce-eager"])
    assert none is None and engine_args.enable_prefix_caching is not False


def test_rejects_kv_rank() -> None:
    with pytest.raises(VllmArgsError, match="kv_rank"):
        parse_serve_args(good_argv({**KV, "kv_rank": 0, "kv_parallel_size": 2}))


def test_rejects_unknown_flag() -> None:
    with pytest.raises(VllmArgsError, match="--no-such-flag"):
        parse_serve_args([*good_argv(), "--no-such-flag", "1"])


def test_rejects_bad_role_value() -> None:
    with pytest.raises(VllmArgsError, match="kv_role"):
        parse_serve_args(good_argv({**KV, "kv_role": "kv_sideways"}))
