"""scripts/build-crd-apiserver.sh refuses a lock whose pinned versions left the archive, by name."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.apiserver.server import BUILD_SCRIPT

pytestmark = pytest.mark.apiserver


def test_a_pinned_version_no_longer_in_the_archive_fails_the_build_naming_it(tmp_path: Path) -> None:
    if os.environ.get("PDX_SKIP_APISERVER") == "1":
        pytest.skip("PDX_SKIP_APISERVER=1")
    pins = [line for line in BUILD_SCRIPT.with_name("crd-apiserver.lock").read_text().splitlines() if "=" in line]
    lock = tmp_path / "test.lock"
    lock.write_text("\n".join([pins[0], "golang-k8s-apiextensions-apiserver-dev=0.0.1-1", pins[-1]]) + "\n")
    env = {**os.environ, "PDX_CACHE": str(tmp_path / "cache"), "PDX_CRD_APISERVER_LOCK": str(lock)}
    result = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, env=env, check=False, timeout=300)
    assert result.returncode == 1 and result.stdout == ""
    named = result.stderr.split("no longer in Debian unstable", 1)[1]
    assert "golang-k8s-apiextensions-apiserver-dev=0.0.1-1" in named
    assert pins[0] not in named and pins[-1] not in named
    assert not (tmp_path / "cache" / "crd-apiserver" / "debs").exists()  # nothing was fetched
