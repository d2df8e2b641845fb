"""GPU engines: KV blocks of 128 tokens, CUDA IPC reads over UCX, no EFA where there is none, decode's CUDA
graphs large enough for a decode-local turn."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pdx.render import engines, render
from pdx.render.engines import kv_transfer_config, serve_args
from pdx.render.router import router_config
from pdx.resource import SpecError
from pdx.spec import GPU_DECODE_LOCAL_MAX_TOKENS
from tests.render.test_render import by_kind, target

ROOT = Path(__file__).parents[2]


def engine_pod(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    pod: dict[str, Any] = by_kind(objects, "StatefulSet")[name]["spec"]["template"]["spec"]
    return pod


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_gpu_engines_get_128_token_kv_blocks_on_both_roles_p5en_included() -> None:
    for t in (target(), target(ROOT / "examples" / "local-gpu.yaml")):
        assert [flag(serve_args(t, role), "--block-size") for role in ("prefill", "decode")] == ["128", "128"]


def test_cpu_engines_keep_the_platforms_own_block_size() -> None:
    assert "--block-size" not in serve_args(target(ROOT / "examples" / "local-cpu.yaml"), "prefill")


def test_an_explicit_block_size_wins_on_both_roles() -> None:
    t = target(spec__kvTransfer__blockSize=128)
    assert [flag(serve_args(t, role), "--block-size") for role in ("prefill", "decode")] == ["128", "128"]


def test_a_block_size_vllm_does_not_take_is_refused_naming_the_field() -> None:
    with pytest.raises(SpecError) as err:
        target(spec__kvTransfer__blockSize=48)
    assert any("kvTransfer.blockSize" in p for p in err.value.problems)


def test_the_gpu_profile_reads_kv_over_cuda_ipc_with_ucx_and_selects_no_instance_type() -> None:
    t = target(ROOT / "examples" / "local-gpu.yaml")
    cfg = kv_transfer_config(t, "decode")
    assert (cfg["kv_buffer_device"], cfg["kv_connector_extra_config"]["backends"]) == ("cuda", ["UCX"])
    pod = engine_pod(render(t), "local-gpu-decode")
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] == "y"
    assert "FI_PROVIDER" not in env and "PDX_REQUIRE_EFA" not in env
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "nodeSelector" not in pod
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_a_gpu_box_with_several_gpus_takes_tensor_parallel_engines() -> None:
    doc_path = ROOT / "examples" / "local-gpu.yaml"
    with pytest.raises(SpecError):
        target(doc_path, spec__prefill__tensorParallelSize=2)
    t = target(doc_path, spec__prefill__tensorParallelSize=2, spec__placement__gpusPerNode=8)
    assert flag(serve_args(t, "prefill"), "--tensor-parallel-size") == "2"
    limits = engine_pod(render(t), "local-gpu-prefill")["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "2"


def test_efa_nodes_read_over_libfabric_without_the_ucx_setting() -> None:
    env = {e["name"] for e in engine_pod(render(target()), "qwen3-32b-prefill")["containers"][0]["env"]}
    assert "FI_PROVIDER" in env and "UCX_CUDA_IPC_ENABLE_GET_ZCOPY" not in env


def graph_size(args: list[str]) -> int | None:
    config = flag(args, "--compilation-config")
    return None if config is None else int(json.loads(config)["max_cudagraph_capture_size"])


def test_a_gpu_decode_captures_cuda_graphs_large_enough_for_a_decode_local_turn() -> None:
    for t in (target(), target(ROOT / "examples" / "local-gpu.yaml")):
        size = graph_size(serve_args(t, "decode"))
        assert size is not None and size % 16 == 0
        # the threshold's new tokens, a block the prefix cache may stop short of, decoding streams
        assert size >= GPU_DECODE_LOCAL_MAX_TOKENS + 128 + 16
        assert graph_size(serve_args(t, "prefill")) is None


def test_decode_never_captures_fewer_graphs_than_vllms_own_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engines, "GPU_DECODE_LOCAL_MAX_TOKENS", 64)
    assert graph_size(serve_args(target(), "decode")) == engines.VLLM_MAX_GRAPH_SIZE


def test_cpu_engines_get_no_compilation_config() -> None:
    t = target(ROOT / "examples" / "local-cpu.yaml")
    assert [graph_size(serve_args(t, role)) for role in ("prefill", "decode")] == [None, None]


@pytest.mark.parametrize(
    "extra",
    [["--compilation-config", '{"cudagraph_mode":"NONE"}'], ["--enforce-eager"], ["-O0"], ["-cc.mode=0"]],
)
def test_extra_args_that_decide_compilation_win_over_the_rendered_graph_size(extra: list[str]) -> None:
    for t in (target(spec__decode__extraArgs=extra), target(spec__model__extraArgs=extra)):
        args = serve_args(t, "decode")
        assert args.count("--compilation-config") == extra.count("--compilation-config")
        assert args[-len(extra) :] == extra


def test_the_routers_threshold_changes_no_engine_argument() -> None:
    """A router field rolls only the router: decode's graphs follow the GPU default, not the field."""
    off = target(spec__router__decodeLocalMaxTokens=0)
    assert serve_args(off, "decode") == serve_args(target(), "decode")


def test_an_idle_decode_takes_long_suffixes_on_gpus_and_none_on_cpu() -> None:
    gpu, cpu = target(), target(ROOT / "examples" / "local-cpu.yaml")
    assert router_config(gpu, "g").decode_local_idle_max_tokens == 8192
    assert router_config(cpu, "g").decode_local_idle_max_tokens == 0
    assert router_config(target(spec__router__decodeLocalIdleMaxTokens=2048), "g").decode_local_idle_max_tokens == 2048


def test_an_idle_bound_below_the_busy_one_is_refused_with_the_field_and_the_fix() -> None:
    with pytest.raises(SpecError, match=r"router\.decodeLocalIdleMaxTokens below decodeLocalMaxTokens.*at least"):
        target(spec__router__decodeLocalMaxTokens=1024, spec__router__decodeLocalIdleMaxTokens=512)
    assert target(spec__router__decodeLocalMaxTokens=1024, spec__router__decodeLocalIdleMaxTokens=0)


def test_claims_wait_for_about_a_second_of_prefill_work_on_gpus_and_on_cpu() -> None:
    gpu, cpu = target(), target(ROOT / "examples" / "local-cpu.yaml")
    assert router_config(gpu, "g").claim_queue_tokens == 32768
    assert router_config(cpu, "g").claim_queue_tokens == 2048  # CPU prefill computes thousands a second
    assert router_config(target(spec__router__claimQueueTokens=0), "g").claim_queue_tokens == 0
