"""Local engines on NVIDIA GPUs: their own GPUs when there are enough, a split GPU when not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdx.local.gpus import GIB, Gpu, GpuPlacement, GpuPlanError, parse_nvidia_smi, place, weight_bytes
from pdx.local.shapedmodel import qwen3_config

ROOT = Path(__file__).parents[2]
H200 = 143771 << 20  # what nvidia-smi reports for one H200, in bytes


def test_engines_get_their_own_gpus_when_the_machine_has_enough() -> None:
    gpus = [Gpu(i, H200) for i in range(4)]
    got = place({"prefill-0": 2, "decode-0": 1, "router-0": 0}, gpus, 16 * GIB)
    assert got == {"prefill-0": GpuPlacement((0, 1)), "decode-0": GpuPlacement((2,))}
    assert got["prefill-0"].env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert got["prefill-0"].args(["--block-size", "64"]) == []  # the whole GPU: vLLM's own sizing


def test_two_engines_on_one_gpu_split_its_memory_and_are_told_their_kv_size() -> None:
    got = place({"prefill-0": 1, "decode-0": 1}, [Gpu(0, H200)], 16 * GIB)
    for share in got.values():
        assert share.devices == (0,)
        assert share.memory_fraction == 0.45
        assert share.kv_cache_bytes is not None and share.kv_cache_bytes % GIB == 0
        # Weights, KV and the per-engine overhead fit the engine's share of the GPU.
        assert 16 * GIB + share.kv_cache_bytes + 6 * GIB <= 0.45 * H200
        assert share.args([]) == [
            "--gpu-memory-utilization",
            "0.45",
            "--kv-cache-memory-bytes",
            str(share.kv_cache_bytes),
        ]


def test_memory_flags_the_resource_sets_itself_are_left_alone() -> None:
    share = place({"prefill-0": 1, "decode-0": 1}, [Gpu(0, H200)], GIB)["decode-0"]
    assert share.args(["--gpu-memory-utilization", "0.3"]) == []
    assert share.args(["--kv-cache-memory-bytes=1000"]) == []


def test_three_engines_on_two_gpus_share_only_where_they_must() -> None:
    got = place({"prefill-0": 1, "decode-0": 1, "decode-1": 1}, [Gpu(0, H200), Gpu(1, H200)], GIB)
    assert [got[n].devices for n in ("prefill-0", "decode-0", "decode-1")] == [(0,), (1,), (0,)]
    assert got["prefill-0"].memory_fraction == got["decode-1"].memory_fraction == 0.45
    assert got["decode-0"].memory_fraction == 0.9


def test_no_gpu_on_the_machine_is_an_error_that_says_what_to_do() -> None:
    with pytest.raises(GpuPlanError, match=r"shows none.*instanceType: cpu"):
        place({"prefill-0": 1}, [], GIB)


def test_tensor_parallel_engines_cannot_share_a_gpu() -> None:
    with pytest.raises(GpuPlanError, match=r"ask for 4 GPUs and this machine has 2.*tensorParallelSize"):
        place({"prefill-0": 2, "decode-0": 2}, [Gpu(0, H200), Gpu(1, H200)], GIB)


def test_a_model_too_large_to_share_one_gpu_is_refused_before_any_start() -> None:
    with pytest.raises(GpuPlanError, match=r"leave prefill-0 0\.0 GiB of KV cache after 65\.0 GiB of weights"):
        place({"prefill-0": 1, "decode-0": 1}, [Gpu(0, H200)], 65 * GIB)


def test_weights_are_estimated_from_the_models_config() -> None:
    # Qwen3-8B: 8.19e9 parameters in bfloat16 (its model card).
    assert 8.1e9 * 2 < weight_bytes(qwen3_config("8b"), "auto") < 8.3e9 * 2
    assert weight_bytes(qwen3_config("8b"), "float32") == 2 * weight_bytes(qwen3_config("8b"), "bfloat16")


def test_nvidia_smi_output_is_read_in_bytes() -> None:
    assert parse_nvidia_smi("0, 143771, NVIDIA H200\n1, 81559, NVIDIA H100 80GB HBM3\n") == [
        Gpu(0, H200, "NVIDIA H200"),
        Gpu(1, 81559 << 20, "NVIDIA H100 80GB HBM3"),
    ]


def _pdx_with_gpus(tmp_path: Path, smi_lines: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi_lines is not None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\nprintf '{smi_lines}'\n")
        smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "PDX_CACHE": str(tmp_path / "cache")}
    code = "import sys, pdx_cli; sys.argv[0] = 'pdx'; pdx_cli.main()"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True)


def test_local_plan_of_the_gpu_example_splits_one_gpu_between_prefill_and_decode(tmp_path: Path) -> None:
    out = _pdx_with_gpus(tmp_path, "0, 143771, NVIDIA H200\\n", "local", "plan", "-f", "examples/local-gpu.yaml")
    assert out.returncode == 0, out.stderr
    engines = [line for line in out.stdout.splitlines() if "pdx_engine.vllm_serve" in line]
    assert len(engines) == 2
    for line in engines:
        assert "CUDA_VISIBLE_DEVICES=0 " in line and "UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y" in line
        assert "--block-size 128" in line and "--gpu-memory-utilization 0.45 --kv-cache-memory-bytes" in line
        assert json.loads(line.split("--kv-transfer-config ")[1].split("'")[1])["kv_buffer_device"] == "cuda"


def test_local_gpu_example_on_a_machine_without_gpus_exits_2_with_one_line(tmp_path: Path) -> None:
    out = _pdx_with_gpus(tmp_path, None, "local", "plan", "-f", "examples/local-gpu.yaml")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "pdx local: local-gpu-prefill-0, local-gpu-decode-0 ask for NVIDIA GPUs and this machine shows none "
        "(nvidia-smi): run on a GPU machine, or set placement.instanceType: cpu"
    ]


def test_local_plan_of_the_gpu_correctness_example_shares_one_gpu_on_its_own_memory_flags(tmp_path: Path) -> None:
    """examples/local-gpu-correct.yaml (scripts/gpu-correct.sh): the seeded float32 model, eager,
    on Triton's attention (FlashAttention has no float32), 2 GiB of KV each, not half the GPU."""
    cr = "examples/local-gpu-correct.yaml"
    out = _pdx_with_gpus(tmp_path, "0, 143771, NVIDIA H200\\n", "local", "plan", "-f", cr)
    assert out.returncode == 0, out.stderr
    engines = [line for line in out.stdout.splitlines() if "pdx_engine.vllm_serve" in line]
    assert len(engines) == 2
    for line in engines:
        assert "CUDA_VISIBLE_DEVICES=0 " in line and "/models/pdx-tiny-w --served-model-name pdx-tiny" in line
        assert "--dtype float32" in line and "--load-format" not in line
        memory = "--gpu-memory-utilization 0.2 --kv-cache-memory-bytes 2147483648"
        assert line.endswith(f"--enforce-eager --attention-backend TRITON_ATTN {memory}")
        assert line.count("--gpu-memory-utilization") == 1
        kv = json.loads(line.split("--kv-transfer-config ")[1].split("'")[1])
        assert kv["kv_buffer_device"] == "cuda" and kv["kv_connector_extra_config"]["bidirectional_kv_xfer"] is True


def test_local_plan_on_two_gpus_gives_each_engine_a_gpu_of_its_own_and_vllms_own_sizing(tmp_path: Path) -> None:
    """Issue 45: on a machine of 2 GPUs, local-gpu.yaml's prefill and decode each get a whole GPU, and no
    memory flag of a shared one."""
    smi = "0, 81559, NVIDIA H100 80GB HBM3\\n1, 81559, NVIDIA H100 80GB HBM3\\n"
    out = _pdx_with_gpus(tmp_path, smi, "local", "plan", "-f", "examples/local-gpu.yaml")
    assert out.returncode == 0, out.stderr
    engines = {role: line for line in out.stdout.splitlines() if "pdx_engine.vllm_serve" in line
               for role in ("prefill", "decode") if f"POD_NAME=local-gpu-{role}-0 " in line}  # fmt: skip
    assert set(engines) == {"prefill", "decode"}
    devices = {role: line.split("CUDA_VISIBLE_DEVICES=")[1].split()[0] for role, line in engines.items()}
    assert sorted(devices.values()) == ["0", "1"]
    for line in engines.values():
        assert "--gpu-memory-utilization" not in line and "--kv-cache-memory-bytes" not in line
        assert "--tensor-parallel-size 1" in line and "UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y" in line


def test_local_plan_of_the_tp2_example_on_four_gpus_gives_each_role_a_pair(tmp_path: Path) -> None:
    """examples/local-gpu-tp2.yaml (scripts/gpu-wave.sh on 4 GPUs): TP 2 per role, two GPUs of its own each."""
    smi = "".join(f"{i}, 143771, NVIDIA H200\\n" for i in range(4))
    out = _pdx_with_gpus(tmp_path, smi, "local", "plan", "-f", "examples/local-gpu-tp2.yaml")
    assert out.returncode == 0, out.stderr
    engines = [line for line in out.stdout.splitlines() if "pdx_engine.vllm_serve" in line]
    assert len(engines) == 2
    devices = sorted(line.split("CUDA_VISIBLE_DEVICES=")[1].split()[0] for line in engines)
    assert devices == ["0,1", "2,3"]
    for line in engines:
        assert "--tensor-parallel-size 2" in line and "--gpu-memory-utilization" not in line
    (tmp_path / "two").mkdir()
    short = _pdx_with_gpus(tmp_path / "two", "0, 143771, NVIDIA H200\\n1, 143771, NVIDIA H200\\n",
                           "local", "plan", "-f", "examples/local-gpu-tp2.yaml")  # fmt: skip
    assert short.returncode == 2 and "ask for 4 GPUs and this machine has 2" in short.stderr
