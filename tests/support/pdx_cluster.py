"""pdx as a user runs it, on the real control plane of ``tests.support.control_plane``: the
``helm`` command built beside it, the chart's operator as a local process with the chart's
ServiceAccount identity, and a watch of an object's every version through ``kubectl get -w``.

kwok runs no container, so the operator the chart's Deployment declares never executes; the
same command line (``kopf run`` and the chart's arguments, read from the installed Deployment)
runs here instead, logged in with a token of the chart's ServiceAccount (TokenRequest API, as
the kubelet would mount it), not with admin credentials.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tests.support.control_plane import CommandFailed, ControlPlane, free_ports, wait_for

__all__ = ["ROOT", "Helm", "ObjectWatch", "Operator", "operator_command"]

ROOT = Path(__file__).parents[2]
VENV_BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Helm:
    """The built ``helm`` command as the cluster's admin, with its own HOME (no user config)."""

    cp: ControlPlane

    @property
    def path(self) -> Path:
        return self.cp.bin_dir / "helm"

    def __call__(self, *args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        home = self.cp.workdir / "helm-home"
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(home),
            "XDG_CACHE_HOME": str(home / "cache"),
            "XDG_CONFIG_HOME": str(home / "config"),
            "XDG_DATA_HOME": str(home / "data"),
            "KUBECONFIG": str(self.cp.admin_kubeconfig),
        }
        argv = [str(self.path), *args]
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise CommandFailed(result.returncode, argv, result.stdout, result.stderr)
        return result


def operator_command(deployment: Mapping[str, Any], health_port: int) -> list[str]:
    """The operator container's command line from the chart's Deployment, for a local process:
    kopf from this virtual environment, the liveness endpoint on loopback at ``health_port``."""
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"]
    command = list(container["command"])
    assert command[0] == "kopf", command
    argv = [str(VENV_BIN / "kopf"), *command[1:]]
    for arg in container.get("args", []):
        if arg.startswith("--liveness="):
            arg = f"--liveness=http://127.0.0.1:{health_port}/healthz"
        argv.append(arg)
    return argv


def container_env(deployment: Mapping[str, Any], pod_name: str) -> dict[str, str]:
    """The operator container's plain env values, and the downward-API ones a kubelet would fill."""
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"]
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[item["name"]] = pod_name
        elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[item["name"]] = deployment["metadata"]["namespace"]
    return env


@dataclass
class Operator:
    """``kopf run`` of the chart's Deployment, as a local process logged in with ``kubeconfig``."""

    argv: list[str]
    kubeconfig: Path
    env: dict[str, str]
    log_path: Path
    health_port: int
    proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def from_deployment(
        cls, cp: ControlPlane, deployment: Mapping[str, Any], kubeconfig: Path, name: str = "operator-0"
    ) -> Operator:
        health, metrics = free_ports(2)
        env = container_env(deployment, name)
        if "PDX_METRICS_PORT" in env:
            env["PDX_METRICS_PORT"] = str(metrics)  # the chart's port is the pod's own; here, a free one
        return cls(
            argv=operator_command(deployment, health),
            kubeconfig=kubeconfig,
            env=env,
            log_path=cp.workdir / "logs" / f"pdx-{name}.log",
            health_port=health,
        )

    def start(self, timeout: float = 60.0) -> Operator:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "PDX_", "POD_"))}
        env.update(self.env, KUBECONFIG=str(self.kubeconfig), PYTHONUNBUFFERED="1")
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                env=env,
                start_new_session=True,
            )
        try:
            wait_for(f"the operator's /healthz on port {self.health_port}", self._healthy, timeout, every=0.2)
        except TimeoutError as err:
            self.stop()
            raise RuntimeError(f"{err}\n{self.log()}") from None
        return self

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"the operator exited with {self.proc.returncode}:\n{self.log()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (kopf's graceful stop), SIGKILL after ``timeout``; returns the exit status."""
        if self.proc is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code

    def log(self, tail: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:] if self.log_path.exists() else ""


@dataclass
class ObjectWatch:
    """Every version of the objects ``kubectl get -w`` reports, from a background thread:
    ``kubectl get KIND NAME -n NS -w --output-watch-events -o json`` (the initial state first)."""

    cp: ControlPlane
    args: Sequence[str]
    events: list[dict[str, Any]] = field(default_factory=list)
    _proc: subprocess.Popen[str] | None = None
    _thread: threading.Thread | None = None

    def __enter__(self) -> ObjectWatch:
        argv = [
            str(self.cp.kubectl_path), "--kubeconfig", str(self.cp.admin_kubeconfig),
            "get", *self.args, "--watch", "--output-watch-events", "-o", "json",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
        self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self._thread = threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True)
        self._thread.start()
        wait_for(f"the first event of kubectl get {' '.join(self.args)} -w", lambda: bool(self.events), timeout=30)
        return self

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        decoder = json.JSONDecoder()
        buffer = ""
        for chunk in iter(lambda: stream.read(1), ""):
            buffer += chunk
            if chunk != "}":
                continue
            try:
                obj, end = decoder.raw_decode(buffer.lstrip())
            except json.JSONDecodeError:
                continue
            self.events.append(obj)
            buffer = buffer.lstrip()[end:]

    def objects(self) -> Iterator[dict[str, Any]]:
        for event in list(self.events):
            yield event["object"]

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._thread is not None:
            self._thread.join(10)
