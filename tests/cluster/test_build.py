"""scripts/build-control-plane.sh: the versions it pins are what runs, and a second call reuses the build."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.support.control_plane import BUILD_SCRIPT, ControlPlane

pytestmark = pytest.mark.cluster


def _version(control_plane: ControlPlane, binary: str) -> str:
    argv = [str(control_plane.bin_dir / binary), "--version"]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout


def test_the_binaries_are_the_pinned_releases(control_plane: ControlPlane) -> None:
    for binary in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        assert _version(control_plane, binary).strip() == "Kubernetes v1.36.3", binary
    assert "etcd Version: 3.6.8" in _version(control_plane, "etcd")
    assert _version(control_plane, "kwok").startswith("kwok version v0.8.0")
    client = json.loads(control_plane.kubectl("version", "--client", "-o", "json").stdout)
    assert client["clientVersion"]["gitVersion"] == "v1.36.3"


def test_the_server_reports_its_release_as_helm_and_kubectl_read_it(control_plane: ControlPlane) -> None:
    version = json.loads(control_plane.kubectl("get", "--raw", "/version").stdout)
    assert (version["major"], version["minor"], version["gitVersion"]) == ("1", "36", "v1.36.3")


def test_a_second_build_reuses_the_cached_one(control_plane: ControlPlane) -> None:
    began = time.monotonic()
    result = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == str(control_plane.bin_dir)
    assert time.monotonic() - began < 10
