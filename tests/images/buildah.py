"""The built images, driven with buildah: config read back, commands run inside, cleaned up.

`buildah run --isolation chroot` is the one way to run an image on these machines (podman,
crun and runc need setrlimit, which the sandbox refuses). It shares the host's network, so
an image's server listens on loopback beside the test's fake engines, and the operator image
reaches the session's control plane there.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "scripts" / "build-images.sh"
# What build-images.sh exits with when buildah cannot be installed on this machine.
NO_BUILDAH = 3


@dataclass(frozen=True)
class Image:
    name: str
    ref: str
    size: str

    def config(self) -> dict[str, Any]:
        """The OCI image config (User, Entrypoint, Cmd, Env, Labels)."""
        out = _buildah("inspect", "--type", "image", self.ref)
        config: dict[str, Any] = json.loads(out)["OCIv1"]["config"]
        return config

    def argv(self) -> list[str]:
        """What a container runtime runs by default: ENTRYPOINT then CMD."""
        config = self.config()
        return [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]


def build() -> dict[str, Image] | str:
    """Build (or take from the cache) both images; the reason instead when buildah is missing."""
    proc = subprocess.run([str(BUILD)], capture_output=True, text=True, check=False, cwd=ROOT)
    if proc.returncode == NO_BUILDAH:
        return proc.stderr.strip()
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/build-images.sh failed:\n{proc.stdout}{proc.stderr}")
    images = {}
    for line in proc.stdout.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and parts[1].startswith("localhost/"):
            images[parts[0]] = Image(*parts)
    return images


@contextmanager
def container(image: Image) -> Iterator[str]:
    """A working container of `image`, removed afterwards."""
    ctr = _buildah("from", "--quiet", "--pull-never", image.ref).strip()
    try:
        yield ctr
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True, check=False)


def run_argv(
    ctr: str,
    argv: Sequence[str],
    *,
    mounts: dict[Path, str] | None = None,
    env: dict[str, str] | None = None,
) -> list[str]:
    """The command line that runs `argv` in `ctr` as the image's own user, read-only mounts."""
    cmd = ["buildah", "run", "--isolation", "chroot"]
    for host, inside in (mounts or {}).items():
        cmd += ["--volume", f"{host}:{inside}:ro"]
    for key, value in (env or {}).items():
        cmd += ["--env", f"{key}={value}"]
    return [*cmd, ctr, "--", *argv]


def run(ctr: str, argv: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(run_argv(ctr, argv), capture_output=True, text=True, timeout=timeout, check=False)


def _buildah(*args: str) -> str:
    return subprocess.run(["buildah", *args], capture_output=True, text=True, check=True).stdout
