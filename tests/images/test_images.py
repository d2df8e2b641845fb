"""The Dockerfiles lint clean and say what the chart and the renderer rely on.

hadolint on every Dockerfile, shellcheck on the entrypoint, and the facts the rest of pdx
depends on (user ids, entrypoints, versions, the EFA installer flags, the loader path). The
operator and router images are also built and run (test_built_images.py); the serving image
cannot be built here (its Ubuntu base and the EFA installer are out of reach), so for it these
readings are all there is.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pdx.render.engines import ENGINE_ENTRYPOINT

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not installed: pip install -e '.[test]'")
    return path


def _dockerfile(name: str) -> str:
    return (IMAGES / name / "Dockerfile").read_text()


def _final_stage(text: str) -> str:
    return text.rsplit("\nFROM ", 1)[-1]


def test_the_three_images_have_dockerfiles() -> None:
    assert [p.parent.name for p in DOCKERFILES] == ["operator", "router", "vllm-efa"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    proc = subprocess.run(
        [_tool("hadolint"), "--no-color", str(dockerfile)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "", proc.stdout + proc.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_base_images_are_pinned_and_oci_labelled(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    defaults = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, flags=re.M))
    for image in re.findall(r"^FROM\s+(\S+)", text, flags=re.M):
        image = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], image)
        assert re.search(r":\d+(\.\d+)+", image), f"unpinned base image {image}"
    for label in ("title", "description", "version", "revision", "base.name"):
        assert f"org.opencontainers.image.{label}=" in text


def test_hadolint_would_catch_an_unpinned_pip_install(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11.11-slim-bookworm\nRUN pip install --no-cache-dir kopf\n")
    proc = subprocess.run([_tool("hadolint"), "--no-color", str(bad)], capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "DL3013" in proc.stdout


@pytest.mark.parametrize(
    ("image", "entrypoint"),
    [("operator", '["kopf", "run"]'), ("router", '["pdx-router"]')],
)
def test_python_images_run_non_root_as_65532_from_this_source(image: str, entrypoint: str) -> None:
    text = _dockerfile(image)
    final = _final_stage(text)
    assert "\nARG BASE=python:3.11." in text and final.startswith("${BASE}\n")
    assert "USER 65532:65532" in final and "useradd --system --uid 65532" in final
    assert f"ENTRYPOINT {entrypoint}" in final
    assert f"--requirement images/{image}/requirements.txt" in text and "pip check" in text
    assert f'--no-index "pdx[{image}] @ file://' in text  # the pinned set satisfies pdx[image] offline
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for source in {folder.split("/")[0] for folder in package_dirs.values()}:
        assert f"COPY {source} {source}" in text


def test_operator_image_default_command_matches_the_charts() -> None:
    final = _final_stage(_dockerfile("operator"))
    assert "--module=pdx.controller.handlers" in final
    assert "--liveness=http://0.0.0.0:8080/healthz" in final
    assert "EXPOSE 8080 9090" in final


def test_router_image_default_config_path_is_the_rendered_one() -> None:
    from pdx.render.router import CONFIG_DIR, CONFIG_FILE

    assert f'CMD ["--config", "{CONFIG_DIR}/{CONFIG_FILE}"]' in _dockerfile("router")


@pytest.mark.parametrize("image", ["operator", "router"])
def test_each_image_pins_every_dependency_of_its_extra(image: str) -> None:
    pins = {}
    for line in (IMAGES / image / "requirements.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    for raw in distribution("pdx").requires or []:
        req = Requirement(raw)
        if req.marker is not None and not req.marker.evaluate({"extra": image}):
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in images/{image}/requirements.txt (freeze_constraints.py)"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} violates {req}"


def test_the_router_image_carries_none_of_the_operators_or_benchmarks_dependencies() -> None:
    pins = (IMAGES / "router" / "requirements.txt").read_text()
    for heavy in ("kubernetes==", "kopf==", "matplotlib==", "numpy=="):
        assert f"\n{heavy}" not in pins, heavy


def test_serving_image_installs_the_versions_and_efa_userspace_the_issue_asks_for() -> None:
    text = _dockerfile("vllm-efa")
    assert "ARG VLLM_VERSION=0.33.0" in text and '"vllm==${VLLM_VERSION}"' in text
    assert "ARG NIXL_VERSION=1.5.1" in text and '"nixl-${NIXL_CUDA}==${NIXL_VERSION}"' in text
    assert "ARG EFA_INSTALLER_VERSION=1.50.0" in text
    assert "./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify" in text
    assert "hwloc" in text
    assert "echo /opt/amazon/efa/lib > /etc/ld.so.conf.d/" in text and "ldconfig" in text
    assert re.search(r"LD_LIBRARY_PATH=/opt/amazon/efa/lib", text)
    assert re.search(r"PATH=[^\n]*/opt/amazon/efa/bin", text)
    # NIXL's LIBFABRIC plugin is checked at build time to resolve the EFA libfabric.
    assert "libplugin_LIBFABRIC" in text and "libfabric\\.so\\.1 => /opt/amazon/efa/lib/" in text


def test_serving_image_carries_the_engine_plugins_so_reused_kv_is_checked_in_the_engines() -> None:
    text = _dockerfile("vllm-efa")
    assert "RUN pip install --no-cache-dir --no-deps /tmp/pdx" in text
    assert "'pdx_prefix_check' in" in text  # the build fails if the entry point is missing
    for part in ("pyproject.toml", "contract", "engine"):
        assert f"COPY {part} /tmp/pdx/{part}" in text


def test_serving_image_entrypoint_is_the_one_the_renderer_runs() -> None:
    text = _dockerfile("vllm-efa")
    assert f"images/vllm-efa/pdx-engine-entrypoint.sh {ENGINE_ENTRYPOINT}" in text
    assert f'ENTRYPOINT ["{ENGINE_ENTRYPOINT}"]' in text


@pytest.mark.parametrize(
    "script",
    [IMAGES / "vllm-efa" / "pdx-engine-entrypoint.sh", IMAGES / "base" / "build-base.sh",
     ROOT / "scripts" / "build-images.sh"],
    ids=lambda p: p.name,
)  # fmt: skip
def test_shellcheck_finds_nothing_in_the_image_scripts(script: Path) -> None:
    proc = subprocess.run([_tool("shellcheck"), str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout
