"""Run a DisaggregatedInference on this machine: rendered pods as processes on loopback.

`LocalTopology(document)` renders the CR with the operator's own code, starts every engine
pod and the router as processes (see `plan`), waits for health, and ends exactly the
processes it started. Tests, `pdx local` and `pdx bench` use it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from pdx.local.gpus import GpuPlacement, place, visible_gpus, weight_bytes
from pdx.local.plan import (
    LOOPBACK,
    OFFLINE_ENV,
    Layout,
    LocalProcess,
    Ports,
    engine_process,
    gpu_ask,
    map_paths,
    router_process,
)
from pdx.local.shapedmodel import SHAPED_CONFIGS, SHAPED_MODELS, build_shaped_model
from pdx.render import render
from pdx.render.meta import ROLES, config_hash
from pdx.render.router import ENDPOINTS_FILE, endpoints_configmap, ready_engine
from pdx.resource import Target, load

# Model names the local runtime builds itself (no hub): name -> (size, seeded weights).
LOCAL_MODELS: dict[str, tuple[str, bool]] = {
    "pdx-tiny": ("tiny", False),
    "pdx-tiny-w": ("tiny", True),
    "pdx-small": ("small", False),
    "pdx-small-w": ("small", True),
}
STATE_ENV = "PDX_LOCAL_STATE"
# Below this a KV read between two engines on one host is not CUDA IPC (TCP gives a few GB/s;
# CUDA IPC on one H200 about 2,000).
MIN_IPC_GBPS = 20.0


def cache_root() -> Path:
    return Path(os.environ.get("PDX_CACHE", Path.home() / ".cache" / "pdx"))


def ephemeral_port_low() -> int:
    """The lowest port the kernel hands out on its own (bind to 0, outgoing connections)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_HANDED_OUT: set[int] = set()
# Each engine pod's NIXL side-channel port, kept for the pod's next start (the next leg): vLLM
# hashes VLLM_NIXL_SIDE_CHANNEL_PORT into its torch.compile cache key (vllm.envs.compile_factors
# leaves out only the host), so a new port per start made every GPU engine compile again: 21-25 s
# a start on the H100 (docs/results/h100-2026-12-05-held: four starts, four cache directories).
_SIDE_CHANNELS: dict[tuple[str, str], int] = {}


def side_channel_port(state_dir: Path, pod: str) -> int:
    """The port this pod's side channel had before, while it is free; a free one otherwise."""
    key = (str(state_dir), pod)
    before = _SIDE_CHANNELS.get(key)
    port = free_port(before, reuse_address=True) if before else free_port()
    _SIDE_CHANNELS[key] = port
    return port


def free_port(preferred: int | None = None, reuse_address: bool = False) -> int:
    """`preferred` when it is free, else a free port below the kernel's ephemeral range.

    A port from that range can go to any other socket between this check and the engine's
    own bind: once a NIXL/UCX listener in the decode's engine core took the port chosen for
    prefill's HTTP server, and half the health checks went to it. Ports below the range are
    only ever taken by an explicit bind.
    """
    low = ephemeral_port_low()
    pool = [p for p in random.sample(range(max(1024, low - 16384), low), 256) if p not in _HANDED_OUT]
    for candidate in ([preferred] if preferred else []) + pool:
        with socket.socket() as s:
            if reuse_address and candidate == preferred:
                # as the listener will bind it (ZMQ sets SO_REUSEADDR): the last start's closed
                # connections in TIME_WAIT do not hold the port, a listening socket does
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((LOOPBACK, candidate))
            except OSError:
                continue
        _HANDED_OUT.add(candidate)
        return candidate
    raise RuntimeError("no free port on loopback below the ephemeral range")


def model_path(target: Target, model_cache: Path) -> Path:
    """Where the engines will read the model: `model.name` under the local model cache."""
    spec = target.spec
    return Path(map_paths(spec.model.name, {spec.model_cache.mount_path: str(model_cache)}))


def ensure_model(target: Target, model_cache: Path) -> Path:
    """The model directory the engines will read; builds pdx's local models on first use."""
    local = model_path(target, model_cache)
    if local.exists():
        return local
    if local.name in SHAPED_MODELS:
        return build_shaped_model(local, SHAPED_MODELS[local.name])
    if local.name not in LOCAL_MODELS:
        return local
    from pdx.local.localmodel import build_local_model

    size, weights = LOCAL_MODELS[local.name]
    built = build_local_model(model_cache / ".built", size, weights=weights)  # type: ignore[arg-type]
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = local.with_name(f".{local.name}.{os.getpid()}")
    tmp.symlink_to(built)
    tmp.replace(local)
    return local


class TopologyError(RuntimeError):
    """A process did not come up; the message carries the tail of its log."""


class LocalTopology:
    """Prefill, decode and router processes for one CR, started and stopped as a unit."""

    def __init__(
        self,
        document: dict[str, Any],
        state_dir: Path | None = None,
        router_port: int | None = None,
        start_timeout: float = 900.0,
    ) -> None:
        self.target = load(document)
        self.state_dir = Path(state_dir or cache_root() / "local" / self.target.name).resolve()
        self.layout = Layout(state_dir=self.state_dir, model_cache=cache_root() / "models")
        self.start_timeout = start_timeout
        self._router_port = router_port
        self.processes: list[LocalProcess] = []
        self._popen: dict[str, subprocess.Popen[bytes]] = {}
        self.model_dir: Path = self.layout.model_cache
        self.generation = config_hash(self.target)
        self.started_at: dict[str, float] = {}
        self.healthy_after: dict[str, float] = {}
        self.gpu_placements: dict[str, GpuPlacement] = {}
        self.kv_read_check = ""  # what the KV read probe saw, on GPUs

    # -- planning ---------------------------------------------------------------------------
    def plan(self) -> list[LocalProcess]:
        objects = render(self.target)
        sets = {o["metadata"]["labels"]["pdx.dev/role"]: o for o in objects if o["kind"] == "StatefulSet"}
        engines: list[LocalProcess] = []
        for role in ROLES:
            for ordinal in range(self.target.spec.role(role).replicas):
                pod = f"{sets[role]['metadata']['name']}-{ordinal}"
                ports = Ports(http=free_port(), side_channel=side_channel_port(self.state_dir, pod))
                engines.append(engine_process(sets[role], ordinal, ports, self.layout))
        engines = self._on_gpus(engines, sets)
        return [*engines, self._router(self.target, objects, engines, free_port(self._router_port))]

    def _router(
        self, target: Target, objects: list[dict[str, Any]], engines: list[LocalProcess], port: int
    ) -> LocalProcess:
        endpoints = [
            ready_engine(p.role, p.name, LOOPBACK, p.generation or "", p.port)  # type: ignore[arg-type]
            for p in engines
        ]
        endpoints_json = endpoints_configmap(target, endpoints)["data"][ENDPOINTS_FILE]
        configmaps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
        deployment = next(o for o in objects if o["kind"] == "Deployment")
        return router_process(deployment, configmaps, endpoints_json, port, self.layout)

    def router_for(self, document: dict[str, Any]) -> LocalProcess:
        """The router `document` renders, in front of this topology's engines and on its port.

        Only for a document whose engines are these (same generation: the router's fields are
        no part of it), as the operator rolls only the router's Deployment for such a change.
        """
        target = load(document)
        if config_hash(target) != self.generation or target.name != self.target.name:
            raise TopologyError("the document changes the engines, not only the router: start a new topology")
        engines = [p for p in self.processes if p.role != "router"]
        return self._router(target, render(target), engines, self.by_role("router")[0].port)

    def reconfigure_router(self, document: dict[str, Any]) -> None:
        """Restart only the router, with `document`'s router fields; the engines keep running."""
        router = self.router_for(document)
        self.processes = [router if p.role == "router" else p for p in self.processes]
        self.target = load(document)
        self.restart(router.name)

    def _on_gpus(self, engines: list[LocalProcess], sets: dict[str, Any]) -> list[LocalProcess]:
        """Each engine's GPUs (and memory share, when engines share a GPU): see pdx.local.gpus."""
        asks = {p.name: gpu_ask(sets[p.role]) for p in engines}
        if not any(asks.values()):
            return engines
        local = model_path(self.target, self.layout.model_cache)
        config = local / "config.json"
        model = json.loads(config.read_text()) if config.is_file() else SHAPED_CONFIGS.get(local.name)
        model_bytes = weight_bytes(model, self.target.spec.model.dtype) if model else 0
        placements = place(asks, visible_gpus(), model_bytes)
        self.gpu_placements = placements
        out = []
        for p in engines:
            share = placements.get(p.name)
            out.append(
                p
                if share is None
                else dataclasses.replace(p, env={**p.env, **share.env}, argv=p.argv + share.args(p.argv))
            )
        return out

    # -- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> LocalTopology:
        self.start()
        return self

    def __exit__(self, *exc: object | TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        live = recorded_alive(self.state_dir)
        if live:
            raise TopologyError(
                f"{self.state_dir} belongs to a running topology ({', '.join(live)}): "
                "stop it with `pdx local down`, or pass another state directory"
            )
        self.model_dir = ensure_model(self.target, self.layout.model_cache)
        self.processes = self.plan()
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        self._check_kv_reads()
        try:
            for proc in self.processes:
                self._spawn(proc)
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        self._write_pids()

    def _check_kv_reads(self) -> None:
        """GPU engines on this host must read each other's KV over CUDA IPC, not silently over TCP:
        a NIXL read between two processes with the engines' own environment proves it first."""
        spec = self.target.spec
        if not self.gpu_placements or "UCX" not in spec.backends or spec.kv_buffer_device != "cuda":
            return
        decode, prefill = self.by_role("decode")[0], self.by_role("prefill")[0]
        devices = [",".join(map(str, self.gpu_placements[p.name].devices)) for p in (decode, prefill)]
        argv = [sys.executable, "-m", "pdx_engine.ipc_probe", "--dev", "cuda", "--min-gbps", str(MIN_IPC_GBPS)]
        result = subprocess.run(
            [*argv, "--devices", ":".join(devices)],
            env={**os.environ, **decode.env, **OFFLINE_ENV},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        self.log_path("ipc-probe").write_text(result.stdout + result.stderr)
        lines = (result.stdout + result.stderr).strip().splitlines()
        if result.returncode != 0:
            raise TopologyError(f"KV reads between the engines would not run as they should: {lines[-1:]}")
        self.kv_read_check = lines[-1].removeprefix("pdx-ipc-probe: ") if lines else ""

    def _spawn(self, proc: LocalProcess) -> None:
        for path, content in proc.files.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(content)
        log = open(self.log_path(proc.name), "ab")  # noqa: SIM115 - owned by the child
        env = {**os.environ, **proc.env, STATE_ENV: str(self.state_dir)}
        self.started_at[proc.name] = time.monotonic()
        self._popen[proc.name] = subprocess.Popen(
            proc.argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        log.close()

    def log_path(self, name: str) -> Path:
        return self.state_dir / "logs" / f"{name}.log"

    def _wait_healthy(self, processes: list[LocalProcess] | None = None) -> None:
        deadline = time.monotonic() + self.start_timeout
        waiting = list(self.processes if processes is None else processes)
        while waiting:
            for proc in list(waiting):
                code = self._popen[proc.name].poll()
                if code is not None:
                    raise TopologyError(f"{proc.name} exited with {code}:\n{self.log_tail(proc.name)}")
                if _http_ok(proc.url + proc.health_path):
                    self.healthy_after[proc.name] = time.monotonic() - self.started_at[proc.name]
                    waiting.remove(proc)
            if time.monotonic() > deadline:
                names = ", ".join(p.name for p in waiting)
                raise TopologyError(f"not healthy within {self.start_timeout:.0f}s: {names}")
            time.sleep(0.5)

    def log_tail(self, name: str, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path(name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _write_pids(self) -> None:
        pids = {name: p.pid for name, p in self._popen.items()}
        (self.state_dir / "pids.json").write_text(json.dumps(pids))
        (self.state_dir / OWNER_FILE).write_text(_process_identity(os.getpid()))

    def kill(self, name: str) -> None:
        """End one process (e.g. a decode between turns) as a node failure would."""
        popen = self._popen[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()

    def restart(self, name: str) -> None:
        """Start a process again with the same plan (a container restart) and wait for health."""
        proc = next(p for p in self.processes if p.name == name)
        if self._popen[name].poll() is None:
            self.kill(name)
        self._spawn(proc)
        self._wait_healthy([proc])
        self._write_pids()

    def stop(self) -> None:
        for popen in self._popen.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for popen in self._popen.values():
            try:
                popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait()
        self._popen.clear()
        for stale in ("pids.json", OWNER_FILE):
            with contextlib.suppress(FileNotFoundError):
                (self.state_dir / stale).unlink()

    # -- what callers read ------------------------------------------------------------------
    def by_role(self, role: str) -> list[LocalProcess]:
        return [p for p in self.processes if p.role == role]

    @property
    def router_url(self) -> str:
        return self.by_role("router")[0].url

    @property
    def engine_urls(self) -> dict[str, list[str]]:
        return {role: [p.url for p in self.by_role(role)] for role in ROLES}

    def peak_rss_mib(self) -> dict[str, float]:
        """Peak resident memory of each process with its children (vLLM's engine core)."""
        return {name: sum(_vm_hwm_kib(pid) for pid in _tree(p.pid)) / 1024 for name, p in self._popen.items()}


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in task.read_text().split()]
    return out


def _vm_hwm_kib(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def recorded_alive(state_dir: Path) -> dict[str, int]:
    """Processes a `pdx local up` recorded in `state_dir` that still run (and are still its own)."""
    pids_file = state_dir / "pids.json"
    if not pids_file.exists():
        return {}
    alive = {}
    for name, pid in json.loads(pids_file.read_text()).items():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"{STATE_ENV}={state_dir}".encode() in environ:  # still ours, not a reused pid
            alive[name] = pid
    return alive


OWNER_FILE = "owner"


def _process_identity(pid: int) -> str:
    """pid and kernel start time: a reused pid does not match."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return f"{pid} {stat.rsplit(')', 1)[1].split()[19]}"


def stop_recorded(state_dir: Path) -> list[str]:
    """End the processes a previous `pdx local up` recorded, and only those, and that `up` itself."""
    owner_file = state_dir / OWNER_FILE
    with contextlib.suppress(OSError, ValueError):
        owner = owner_file.read_text()
        pid = int(owner.split()[0])
        if pid != os.getpid() and _process_identity(pid) == owner:
            os.kill(pid, signal.SIGTERM)  # it stops its processes itself; the loop below makes sure
    with contextlib.suppress(FileNotFoundError):
        owner_file.unlink()
    stopped = []
    for name, pid in recorded_alive(state_dir).items():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
            stopped.append(name)
    with contextlib.suppress(FileNotFoundError):
        (state_dir / "pids.json").unlink()
    return stopped
