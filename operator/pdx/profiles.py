"""Instance-type profiles: what a node of a kind offers, so the spec can stay short.

A profile fills node selector, GPU and EFA counts, hugepages, /dev/shm, the libfabric
environment and the engine environment the node kind needs; every value can still be
overridden in `spec.placement` (and the engine environment in each role's `env`). The CRD's CEL rules
embed this same table (see `pdx.rules`), so the API server and the models agree on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class InstanceProfile:
    """What one node of an instance type offers to one engine pod."""

    gpus: int
    efa_devices: int
    hugepages_2mi: str | None = None
    shm_size: str = "16Gi"
    gpu_taint: bool = True
    memory_gi: int | None = None  # per node; an engine pod asks its GPU share of it
    cpus: int | None = None  # per node, likewise
    fi_env: dict[str, str] = field(default_factory=dict)
    engine_env: dict[str, str] = field(default_factory=dict)  # every engine on this kind of node
    instance_selector: bool = True  # select nodes by node.kubernetes.io/instance-type (not for generic kinds)


# Environment libfabric needs to use EFA with GPU memory (NIXL's LIBFABRIC backend).
EFA_ENV: dict[str, str] = {
    "FI_PROVIDER": "efa",
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "FI_EFA_FORK_SAFE": "1",
    "FI_HMEM_DISABLE_P2P": "0",
    "NIXL_LOG_LEVEL": "INFO",
}


# vLLM CPU engines with bidirectional transfer on a few cores: no torch.compile on the request
# path, and no spinning where an idle engine would spin (pdx_engine.nixl_progress, pdx_engine.idle_wait,
# pdx_engine.shm_recheck; docs/engine-notes.md has what each one cost before).
CPU_ENGINE_ENV: dict[str, str] = {
    "TORCHDYNAMO_DISABLE": "1",
    "PDX_NIXL_PROGRESS_DELAY_US": "1000",
    "PDX_ENGINE_IDLE_WAIT_MS": "3000",
    "PDX_SHM_RECHECK_MS": "2",
    "PDX_SHM_BUSY_LOOP_MS": "20",
}


# NVIDIA GPUs without EFA, NIXL over UCX: engines on one host read each other's KV over CUDA IPC.
# UCX turns cuda_ipc reads (GET) off when it sees no NVLink between the devices (one GPU shared by
# both roles, PCIe-only boxes); NIXL's reads then go over TCP at a few GB/s. With this set, a 1 GiB
# read between two processes on one H200 ran at about 2,000 GB/s (docs/gpu.md).
UCX_GPU_ENV: dict[str, str] = {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y"}


def _gpu_node(efa_devices: int, memory_gi: int, cpus: int, shm_size: str) -> InstanceProfile:
    """An 8-GPU EFA node; engine pods ask their GPU share of its memory and CPUs."""
    return InstanceProfile(
        gpus=8,
        efa_devices=efa_devices,
        memory_gi=memory_gi,
        cpus=cpus,
        hugepages_2mi="5128Mi",
        shm_size=shm_size,
        fi_env=EFA_ENV,
    )


PROFILES: dict[str, InstanceProfile] = {
    "p5en.48xlarge": _gpu_node(efa_devices=16, memory_gi=1900, cpus=180, shm_size="64Gi"),
    "p5.48xlarge": _gpu_node(efa_devices=32, memory_gi=1900, cpus=180, shm_size="64Gi"),
    "p5e.48xlarge": _gpu_node(efa_devices=32, memory_gi=1900, cpus=180, shm_size="64Gi"),
    "p4d.24xlarge": _gpu_node(efa_devices=4, memory_gi=1100, cpus=90, shm_size="32Gi"),
    # No accelerator and no EFA: the local CPU runtime and CPU-only test clusters.
    "cpu": InstanceProfile(
        gpus=0, efa_devices=0, shm_size="1Gi", gpu_taint=False, engine_env=CPU_ENGINE_ENV, instance_selector=False
    ),
    # Any machine with NVIDIA GPUs and no EFA: `pdx local` on a GPU box, GPU clusters without EFA.
    # One GPU unless placement.gpusPerNode says more; the local runtime gives each engine its own
    # GPUs, or splits one GPU's memory between engines when there are fewer GPUs than engines.
    "gpu": InstanceProfile(gpus=1, efa_devices=0, engine_env=UCX_GPU_ENV, instance_selector=False),
}

DEFAULT_INSTANCE_TYPE = "p5en.48xlarge"
