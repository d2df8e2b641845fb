"""NVIDIA GPUs for local engines: what Kubernetes' device plugin does in a cluster, done here.

An engine pod asks `nvidia.com/gpu` GPUs. With at least as many GPUs as the engines ask, each
engine gets its own (CUDA_VISIBLE_DEVICES). With fewer, engines of one GPU each share: the GPU's
memory is split between them, and each is told its KV cache size (`--kv-cache-memory-bytes`),
so vLLM skips its memory profiling and both engines can start at the same time (profiling
measures free memory, which the other engine's start changes under it). The planning is pure;
`visible_gpus` is the one query of the machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GIB = 1 << 30
# Share of a GPU that engines sharing it may take together: vLLM's own default utilization.
SHARED_UTILIZATION = 0.90
# Per engine, beyond weights and KV: CUDA context, activations, CUDA graphs, NCCL/NIXL buffers.
# 8B-shaped engines on one H200 used about 5 GiB of it with CUDA graphs captured.
ENGINE_OVERHEAD_BYTES = 6 * GIB
# Fewer KV bytes than this cannot hold one long conversation: refuse rather than start crippled.
MIN_KV_BYTES = 2 * GIB
MEMORY_FLAGS = ("--gpu-memory-utilization", "--kv-cache-memory-bytes")
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


class GpuPlanError(ValueError):
    """The engines cannot be placed on this machine's GPUs; the message says what to change."""


@dataclass(frozen=True)
class Gpu:
    index: int
    memory_bytes: int
    name: str = ""


@dataclass(frozen=True)
class GpuPlacement:
    """One engine's share: its devices, and the memory settings when it shares them."""

    devices: tuple[int, ...]
    memory_fraction: float | None = None
    kv_cache_bytes: int | None = None

    @property
    def env(self) -> dict[str, str]:
        # nvidia-smi numbers GPUs in PCI bus order; CUDA does too only when told so.
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(map(str, self.devices))}

    def args(self, argv: Sequence[str]) -> list[str]:
        """Memory flags to add, unless the engine's own arguments set either one already."""
        if self.memory_fraction is None or any(a.split("=")[0] in MEMORY_FLAGS for a in argv):
            return []
        out = ["--gpu-memory-utilization", f"{self.memory_fraction:.2f}"]
        if self.kv_cache_bytes is not None:
            out += ["--kv-cache-memory-bytes", str(self.kv_cache_bytes)]
        return out


def weight_bytes(config: Mapping[str, Any], dtype: str) -> int:
    """A decoder-only transformer's weight bytes from its Hugging Face config (a close estimate:
    embeddings, attention and MLP matrices; norms and biases are noise at this scale)."""
    hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * int(config["intermediate_size"])
    embeddings = int(config["vocab_size"]) * hidden * (1 if config.get("tie_word_embeddings") else 2)
    if dtype == "auto":
        dtype = str(config.get("torch_dtype") or "bfloat16")
    return (embeddings + layers * (attention + mlp)) * _DTYPE_BYTES.get(dtype, 2)


def place(asks: Mapping[str, int], gpus: Sequence[Gpu], model_bytes: int) -> dict[str, GpuPlacement]:
    """Devices for each engine (name -> GPUs it asks), in the order given."""
    wanted = {name: n for name, n in asks.items() if n > 0}
    if not wanted:
        return {}
    if not gpus:
        raise GpuPlanError(
            f"{', '.join(wanted)} ask for NVIDIA GPUs and this machine shows none (nvidia-smi): "
            "run on a GPU machine, or set placement.instanceType: cpu"
        )
    total = sum(wanted.values())
    if total <= len(gpus):
        out, next_gpu = {}, 0
        for name, n in wanted.items():
            out[name] = GpuPlacement(tuple(g.index for g in gpus[next_gpu : next_gpu + n]))
            next_gpu += n
        return out
    if any(n > 1 for n in wanted.values()):
        raise GpuPlanError(
            f"the engines ask for {total} GPUs and this machine has {len(gpus)}; only engines of one GPU "
            "can share one: lower prefill/decode tensorParallelSize or replicas"
        )
    names = list(wanted)
    per_gpu = -(-len(names) // len(gpus))
    out = {}
    for i, name in enumerate(names):
        gpu = gpus[i % len(gpus)]
        sharing = len(names[i % len(gpus) :: len(gpus)])
        fraction = int(SHARED_UTILIZATION / sharing * 100) / 100
        kv = int(gpu.memory_bytes * fraction) - model_bytes - ENGINE_OVERHEAD_BYTES
        if kv < MIN_KV_BYTES:
            raise GpuPlanError(
                f"{per_gpu} engines on one GPU of {gpu.memory_bytes / GIB:.0f} GiB leave {name} "
                f"{max(kv, 0) / GIB:.1f} GiB of KV cache after {model_bytes / GIB:.1f} GiB of weights: "
                "use a smaller model, fewer replicas, or a machine with more GPUs"
            )
        out[name] = GpuPlacement((gpu.index,), fraction, kv // GIB * GIB)
    return out


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=index,memory.total,name --format=csv,noheader,nounits` (MiB)."""
    gpus = []
    for line in text.strip().splitlines():
        index, mib, name = (part.strip() for part in line.split(",", 2))
        gpus.append(Gpu(int(index), int(mib) << 20, name))
    return gpus


def visible_gpus(environ: Mapping[str, str] = os.environ) -> list[Gpu]:
    """This machine's GPUs, narrowed to CUDA_VISIBLE_DEVICES (indices) when that is set."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    query = [smi, "--query-gpu=index,memory.total,name", "--format=csv,noheader,nounits"]
    result = subprocess.run(query, capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0:
        return []
    gpus = parse_nvidia_smi(result.stdout)
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return gpus
    keep = [int(v) for v in visible.split(",") if v.strip().isdigit()]
    return [g for g in gpus if g.index in keep]
