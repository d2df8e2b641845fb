"""Prefill and decode engines: `vllm serve` arguments, kv-transfer-config, pods, StatefulSets.

Everything an engine needs is decided here once; the operator applies it and the local
runtime runs the same container command and environment as processes.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pdx import labels
from pdx.render import meta
from pdx.render.meta import HTTP_PORT, Role
from pdx.resource import Target
from pdx.rules import quantity_value
from pdx.spec import GPU_DECODE_LOCAL_MAX_TOKENS

# The serving image's entrypoint: optional EFA check, then exec its arguments.
ENGINE_ENTRYPOINT = "/usr/local/bin/pdx-engine-entrypoint"
# pdx_engine/drain.py in the serving image: a decode's preStop (see `drain`).
DRAIN_PROGRAM = "/usr/local/bin/pdx-drain"
# After the drain, vLLM's own shutdown (in-flight requests finish).
SHUTDOWN_SECONDS = 60
# Kubernetes expands $(VAR) in args from the container's env; the local runtime does the same.
PORT_ENV = "PDX_HTTP_PORT"
HOST_ENV = "PDX_HTTP_HOST"
KV_ROLE: dict[Role, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}
HF_TOKEN_DIR = "/var/run/secrets/pdx/hf-token"
HF_TOKEN_FILE = f"{HF_TOKEN_DIR}/token"


def kv_transfer_config(target: Target, role: Role) -> dict[str, Any]:
    """The NixlConnector config; equal on both roles but for kv_role.

    No engine_id: vLLM draws a fresh uuid4 per process. One per pod (name and UID) survived a
    container restart, and decode, which keeps NIXL state per engine id, went on using the dead
    process's agent: every pull from the restarted prefill failed with NIXL_ERR_REMOTE_DISCONNECT
    (seen with real engines, tests/e2e). Nothing in pdx reads the id."""
    kv = target.spec.kv_transfer
    return {
        "kv_connector": "NixlConnector",
        "kv_role": KV_ROLE[role],
        "kv_buffer_device": target.spec.kv_buffer_device,
        "kv_load_failure_policy": kv.load_failure_policy,
        "kv_connector_extra_config": {
            "backends": target.spec.backends,
            "bidirectional_kv_xfer": kv.bidirectional,
            "decoder_kv_blocks_ttl": kv.decoder_kv_blocks_ttl_seconds,
            "kv_recompute_threshold": kv.kv_recompute_threshold,
            # Both roles read it: prefill holds its blocks for it and renews them by 2/3 of its own
            # value, decode heartbeats every 1/6 of its own. Equal values keep the two in step.
            "kv_lease_duration": kv.kv_lease_duration_seconds,
        },
    }


# vLLM runs a batch as a CUDA graph only up to CompilationConfig.max_cudagraph_capture_size tokens,
# min(2 * max_num_seqs, 512) by default (0.26-0.32); a larger one runs eagerly. A decode-local
# turn puts its new tokens, up to a block more when the prefix cache stops short, into decode's
# batch: eagerly that step took 30-45 ms on the H200 (streams' ITL p99 33-48 ms against 10-20 on
# the D->P path; decode's own prefill time 38-45 ms for ~300 tokens, docs/results/h200-2026-12-04)
# whatever the suffix, with graphs up to 32 tokens (maxNumSeqs 16). So decode captures graphs up
# to the GPU threshold plus a block and the decoding streams, and never fewer than vLLM's most.
GRAPH_SIZE_STEP = 16  # vLLM's capture sizes go up in steps of 16 past 256
VLLM_MAX_GRAPH_SIZE = 512
# Flags with which a role's extraArgs decide graphs themselves.
COMPILATION_FLAGS = ("--compilation-config", "-cc", "-O", "--enforce-eager")


# Decode starts with the token prefill already streamed (router.firstTokenFromPrefill).
FIRST_TOKEN_PROCESSOR = "pdx_engine.first_token:FirstTokenFromPrefill"


def decode_graph_size(target: Target) -> int:
    """The largest batch, in tokens, that a GPU decode captures as a CUDA graph (see above)."""
    spec = target.spec
    tokens = GPU_DECODE_LOCAL_MAX_TOKENS + (spec.block_size or 0) + GRAPH_SIZE_STEP
    return max(VLLM_MAX_GRAPH_SIZE, math.ceil(tokens / GRAPH_SIZE_STEP) * GRAPH_SIZE_STEP)


def graph_args(target: Target, role: Role) -> list[str]:
    """`--compilation-config` for a GPU decode, unless its extraArgs say how to compile."""
    spec = target.spec
    if role != "decode" or spec.kv_buffer_device != "cuda":
        return []
    extra = [*spec.model.extra_args, *spec.role(role).extra_args]
    if any(a.startswith(COMPILATION_FLAGS) for a in extra):
        return []
    config = {"max_cudagraph_capture_size": decode_graph_size(target)}
    return ["--compilation-config", json.dumps(config, separators=(",", ":"))]


def serve_args(target: Target, role: Role) -> list[str]:
    """Arguments after `vllm serve` (the model first)."""
    spec, model = target.spec, target.spec.model
    args = [
        model.name,
        "--served-model-name", model.served_name,
        "--host", f"$({HOST_ENV})",
        "--port", f"$({PORT_ENV})",
        "--tensor-parallel-size", str(spec.role(role).tensor_parallel_size),
        "--dtype", model.dtype,
    ]  # fmt: skip
    if model.revision:
        args += ["--revision", model.revision]
    if model.max_model_len:
        args += ["--max-model-len", str(model.max_model_len)]
    if model.max_num_seqs:
        args += ["--max-num-seqs", str(model.max_num_seqs)]
    if model.load_format:
        args += ["--load-format", model.load_format]
    if spec.block_size is not None:
        args += ["--block-size", str(spec.block_size)]
    args.append("--enable-prefix-caching" if spec.prefix_caching(role) else "--no-enable-prefix-caching")
    args += [
        "--kv-transfer-config",
        json.dumps(kv_transfer_config(target, role), separators=(",", ":")),
    ]
    args += graph_args(target, role)
    if role == "decode" and spec.router.first_token_from_prefill:
        args += ["--logits-processors", FIRST_TOKEN_PROCESSOR]
    return args + list(model.extra_args) + list(spec.role(role).extra_args)


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def engine_env(target: Target, role: Role) -> list[dict[str, Any]]:
    spec = target.spec
    env: list[dict[str, Any]] = [
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_IP", "status.podIP"),
        {"name": HOST_ENV, "value": "0.0.0.0"},
        {"name": PORT_ENV, "value": str(HTTP_PORT)},
        # What the engine advertises as remote_host: must be the pod IP, not localhost.
        {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "$(POD_IP)"},
        {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(spec.kv_transfer.side_channel_port)},
        {"name": "HF_HOME", "value": spec.model_cache.hf_home_path},
    ]
    if spec.hf_token_secret:
        # A file, not HF_TOKEN: an environment variable shows in /proc/<pid>/environ, crash
        # reports and every child process; huggingface_hub reads the file HF_TOKEN_PATH names.
        env.append({"name": "HF_TOKEN_PATH", "value": HF_TOKEN_FILE})
    if spec.engine_api_key_secret:
        # What `vllm serve --api-key` sets, without the key on the command line (vLLM reads
        # no key file, so this one is an environment variable).
        ref = {"name": spec.engine_api_key_secret.name, "key": spec.engine_api_key_secret.key}
        env.append({"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": ref}})
    extra: dict[str, str] = dict(spec.placement.profile.engine_env)
    if spec.uses_efa:
        extra.update(spec.placement.profile.fi_env)
        extra.update(spec.placement.fi_env)
        if spec.placement.efa_check is not False:
            extra["PDX_REQUIRE_EFA"] = "1"
    if role == "decode" and spec.kv_transfer.bidirectional:  # read by the preStop (see `drain`)
        extra.update(PDX_DRAIN_ROUTER=meta.router_url(target), PDX_DRAIN_SECONDS=str(spec.router_ttl))
        if not spec.kv_transfer.release_under_pressure:  # read by pdx_engine.held_kv (on unless 0)
            extra["PDX_HELD_KV_VALVE"] = "0"
        if spec.kv_transfer.held_kv_max_fraction is not None:  # read by pdx_engine.held_kv
            extra["PDX_HELD_KV_MAX_FRACTION"] = repr(spec.kv_transfer.held_kv_max_fraction)
    cache_bytes = int(quantity_value(spec.role(role).tokenize_cache))
    if cache_bytes > 0:  # read by pdx_engine.tokenize_cache
        extra["PDX_TOKENIZE_CACHE_BYTES"] = str(cache_bytes)
    extra.update(spec.role(role).env)
    env += [{"name": k, "value": v} for k, v in sorted(extra.items())]
    return env


def engine_resources(target: Target, role: Role) -> dict[str, Any]:
    spec = target.spec
    res = spec.role(role).resources
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    gpus, efa, node_gpus = spec.gpus(role), spec.efa_devices(role), spec.placement.gpus
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    if efa:
        limits["vpc.amazonaws.com/efa"] = str(efa)
    hugepages = spec.placement.hugepages2_mi or spec.placement.profile.hugepages_2mi
    if hugepages and spec.uses_efa and efa:  # libfabric's buffers, for the pods that use EFA
        limits["hugepages-2Mi"] = hugepages
    profile = spec.placement.profile
    share = gpus / node_gpus if node_gpus and gpus else None
    memory = res.memory or (f"{math.floor(profile.memory_gi * share)}Gi" if profile.memory_gi and share else None)
    cpu = res.cpu or (str(math.floor(profile.cpus * share)) if profile.cpus and share else None)
    if memory:
        requests["memory"] = limits["memory"] = memory
    if cpu:
        requests["cpu"] = cpu
        if res.limit_cpu:
            limits["cpu"] = cpu
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 5,
    }


def engine_security_context(target: Target) -> dict[str, Any]:
    """As little as vLLM and EFA allow: no capability but the two EFA needs, no escalation,
    the runtime's default seccomp profile.

    EFA registers pinned memory: IPC_LOCK lets it lock pages, SYS_RESOURCE lift the
    locked-memory limit. Still root (the serving image has no other user, and the model cache
    PVC is written as root) and a writable root filesystem (vLLM, torch, triton and flashinfer
    write caches under ~/.cache and /tmp at run time). `placement.privileged` gives all of it
    up for EFA setups that need it.
    """
    place = target.spec.placement
    if place.privileged:
        return {"privileged": True, "allowPrivilegeEscalation": True}
    caps: dict[str, Any] = {"drop": ["ALL"]}
    if target.spec.uses_efa:
        caps["add"] = ["IPC_LOCK", "SYS_RESOURCE"]
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": caps,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def engine_container(target: Target, role: Role) -> dict[str, Any]:
    spec = target.spec
    probes = spec.role(role).probes
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "model-cache", "mountPath": spec.model_cache.mount_path},
    ]
    if spec.hf_token_secret:
        mounts.append({"name": "hf-token", "mountPath": HF_TOKEN_DIR, "readOnly": True})
    return {
        "name": "vllm",
        "image": spec.image.ref,
        "imagePullPolicy": spec.image.pull_policy,
        "command": [ENGINE_ENTRYPOINT],
        "args": ["vllm", "serve", *serve_args(target, role)],
        "env": engine_env(target, role),
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {
                "name": "nixl",
                "containerPort": spec.kv_transfer.side_channel_port,
                "protocol": "TCP",
            },
        ],
        "resources": engine_resources(target, role),
        "volumeMounts": mounts,
        "startupProbe": _probe("/health", 10, math.ceil(probes.startup_timeout_seconds / 10)),
        "readinessProbe": _probe("/health", probes.period_seconds, probes.failure_threshold),
        "livenessProbe": _probe("/health", probes.period_seconds, probes.failure_threshold),
        "securityContext": engine_security_context(target),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        **drain(target, role),
    }


def drain(target: Target, role: Role) -> dict[str, Any]:
    """A decode going away first lets its conversations move (pdx_engine/drain.py): at most the
    router's entry deadline, after which no entry points at it anyway."""
    if role != "decode" or not target.spec.kv_transfer.bidirectional:
        return {}
    return {"lifecycle": {"preStop": {"exec": {"command": ["python3", DRAIN_PROGRAM]}}}}


def engine_pod_spec(target: Target, role: Role) -> dict[str, Any]:
    spec = target.spec
    place, role_spec = spec.placement, spec.role(role)
    node_selector = {"node.kubernetes.io/instance-type": place.instance_type} if place.profile.instance_selector else {}
    node_selector.update(role_spec.node_selector)
    tolerations = list(role_spec.tolerations)
    taint = place.gpu_taint_toleration if place.gpu_taint_toleration is not None else place.profile.gpu_taint
    if taint and spec.gpus(role):
        tolerations.insert(0, {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
    cache: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": spec.model_cache.claim_name}}
        if spec.model_cache.claim_name
        else {"emptyDir": {}}
    )
    shm = role_spec.shm_size or place.profile.shm_size
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
        {"name": "model-cache", **cache},
    ]
    if spec.hf_token_secret:
        secret = spec.hf_token_secret
        volumes.append(
            {
                "name": "hf-token",
                "secret": {
                    "secretName": secret.name,
                    "items": [{"key": secret.key, "path": "token"}],
                    "defaultMode": 0o400,
                },
            }
        )
    pod: dict[str, Any] = {
        # Service links would inject e.g. VLLM_PORT for a Service named `vllm`, which vLLM reads.
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": SHUTDOWN_SECONDS + (spec.router_ttl if drain(target, role) else 0),
        "containers": [engine_container(target, role)],
        "volumes": volumes,
    }
    if node_selector:
        pod["nodeSelector"] = node_selector
    if tolerations:
        pod["tolerations"] = tolerations
    if role_spec.affinity:
        pod["affinity"] = role_spec.affinity
    if spec.image.pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in spec.image.pull_secrets]
    return pod


def engine_statefulset(target: Target, role: Role, config_hash: str) -> dict[str, Any]:
    name = meta.engine_name(target, role)
    pod_labels = {**meta.labels(target, role), labels.CONFIG_HASH: config_hash}
    # An autoscaled role's replicas belong to its autoscaler: not rendered, so never applied.
    replicas = {} if target.spec.role(role).autoscaling else {"replicas": target.spec.role(role).replicas}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta.metadata(target, name, role, annotations={labels.CONFIG_HASH: config_hash}),
        "spec": {
            "serviceName": name,
            **replicas,
            # Engines are independent: start and replace them all at once, not one by one.
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate"},
            "selector": {"matchLabels": meta.selector(target, role)},
            "template": {"metadata": {"labels": pod_labels}, "spec": engine_pod_spec(target, role)},
        },
    }


def engine_service(target: Target, role: Role) -> dict[str, Any]:
    """Headless: the router and NIXL address engines pod by pod, never through a VIP."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta.metadata(target, meta.engine_name(target, role), role),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": False,
            "selector": meta.selector(target, role),
            "ports": [
                {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {
                    "name": "nixl",
                    "port": target.spec.kv_transfer.side_channel_port,
                    "targetPort": "nixl",
                    "protocol": "TCP",
                },
            ],
        },
    }
