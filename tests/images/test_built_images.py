"""The operator and router images, built with buildah and run: what a user's cluster would run.

Each image runs its own ENTRYPOINT (with the rendered args, as the kubelet would, or its own
CMD), as the image's user, with its config mounted read-only where the rendered objects put it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from pdx.local.topology import free_port
from pdx.render import config_hash, ready_engine, render
from pdx.resource import load
from tests.images.buildah import ROOT, Image, container, run, run_argv
from tests.router.helpers import LONG, assistant, stream_text, user
from tests.support.control_plane import ControlPlane, wait_for, write_kubeconfig
from tests.support.operator_cluster import Cluster, cr_document, expected_children

pytestmark = pytest.mark.images

UID = 65532  # the renderer's and the chart's runAsUser
# The wheel's top-level packages and their source folders, as pyproject.toml maps them.
_SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
PACKAGES = {name: ROOT / folder for name, folder in _SETUPTOOLS["package-dir"].items()}
NAMES = ("operator", "router")
NAME = "demo"


@pytest.fixture(params=NAMES)
def image(request: pytest.FixtureRequest, images: dict[str, Image]) -> Image:
    return images[request.param]


def _inside(image: Image, script: str) -> str:
    """Run a Python snippet in the image as its user; its stdout."""
    with container(image) as ctr:
        proc = run(ctr, ["python", "-c", script])
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_images_run_as_the_non_root_uid_the_renderer_and_chart_declare(image: Image) -> None:
    chart = yaml.safe_load((ROOT / "charts" / "pdx-operator" / "values.yaml").read_text())
    rendered = _router_deployment(load(_seed(port=8000)))["spec"]["template"]["spec"]["containers"][0]
    assert chart["podSecurityContext"]["runAsUser"] == rendered["securityContext"]["runAsUser"] == UID
    assert image.config()["User"] == f"{UID}:{UID}"
    assert _inside(image, "import os; print(os.getuid(), os.getgid())").split() == [str(UID), str(UID)]


def test_pip_check_is_clean_inside(image: Image) -> None:
    with container(image) as ctr:
        proc = run(ctr, ["pip", "check"])
    assert proc.returncode == 0 and "No broken requirements" in proc.stdout, proc.stdout + proc.stderr


def test_installed_pdx_is_this_source_tree(image: Image) -> None:
    """Same version, and every module of the source tree installed (a subpackage once went
    missing from the wheel)."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    script = (  # find_spec, not import: each image carries the dependencies of its own program only
        "import importlib.util, importlib.metadata as m, json, pathlib\n"
        f"names = {sorted(PACKAGES)!r}\n"
        "dirs = {n: pathlib.Path(importlib.util.find_spec(n).submodule_search_locations[0]) for n in names}\n"
        "mods = {n: sorted(str(p.relative_to(d)) for p in d.rglob('*.py')) for n, d in dirs.items()}\n"
        "print(json.dumps({'version': m.version('pdx'), 'modules': mods}))\n"
    )
    found = json.loads(_inside(image, script))
    assert found["version"] == version
    for name, src in PACKAGES.items():
        expected = sorted(str(p.relative_to(src)) for p in src.rglob("*.py") if "__pycache__" not in p.parts)
        assert found["modules"][name] == expected, name


def test_the_router_image_runs_its_compiled_data_path(images: dict[str, Image]) -> None:
    """Built in the image's build stage for its own Python, and current for the sources the
    wheel installed (else pdx_router would fall back to the .py files)."""
    script = (
        "import pdx_router as p, pdx_router.app as a, pdx_router.scan as c, pdx_router.store as s\n"
        "print(p.NATIVE, a.__file__, c.__file__, s.__file__, sep='\\n')"
    )
    state, app, scan, store = _inside(images["router"], script).splitlines()
    assert state == "compiled", state
    # The request's path is compiled (native.COMPILED, and scan.c); the store, for one, stays Python.
    assert app.endswith(".so") and "/pdx_router/_native/" in app and store.endswith("/pdx_router/store.py")
    assert scan.endswith(".so") and "/pdx_router/_native/" in scan


def test_final_stage_has_no_compilers_or_build_leftovers(image: Image) -> None:
    script = (
        "import glob, json, shutil\n"
        "tools = [t for t in ('gcc', 'cc', 'c++', 'g++', 'clang', 'make', 'ld') if shutil.which(t)]\n"
        "left = [p for pattern in ('/src', '/tmp/wheels', '/root/.cache', '/.cache', '/opt/**/*.whl',\n"
        "        '/opt/pdx/lib/python3*/site-packages/setuptools', '/opt/pdx/lib/python3*/site-packages/wheel',\n"
        "        '/opt/pdx/lib/python3*/site-packages/mypy', '/opt/pdx/lib/python3*/site-packages/mypyc')\n"
        "        for p in glob.glob(pattern, recursive=True)]\n"
        "print(json.dumps({'tools': tools, 'left': left}))\n"
    )
    assert json.loads(_inside(image, script)) == {"tools": [], "left": []}


# Each image holds its program's dependencies only (pdx[operator] / pdx[router]); measured at
# 315 and 236 MB on the Debian base. The bound catches a build that swallows a cache or the
# benchmark's plotting stack.
SIZE_BOUND_MB = {"operator": 400, "router": 300}


def test_image_size_stays_bounded(image: Image) -> None:
    """Sizes are reported at the end of the run as well."""
    number, unit = image.size.split()
    assert unit == "MB" and float(number) < SIZE_BOUND_MB[image.name], image.size


# -- the router image serves a conversation between fake engines --------------------------


def _seed(port: int) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "seed-qwen3-32b-1p1d.yaml").read_text())
    doc["spec"].setdefault("router", {}).update(port=port, reuseHeaders=True)  # tenancy: by API key
    return doc


def _router_deployment(target: Any) -> dict[str, Any]:
    return next(o for o in render(target) if o["kind"] == "Deployment")


def _mounted_configs(objects: list[dict[str, Any]], into: Path) -> dict[Path, str]:
    """Each ConfigMap the Deployment mounts, written as a ConfigMap volume would hold it
    (files 0644 in a world-readable folder), mapped to its mount path."""
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    into.mkdir(mode=0o755)
    mounts: dict[Path, str] = {}
    for mount in pod["containers"][0]["volumeMounts"]:
        source = volumes[mount["name"]].get("configMap")
        if source is None:
            continue
        folder = into / mount["name"]
        folder.mkdir(mode=0o755)
        for key, text in maps[source["name"]]["data"].items():
            (folder / key).write_text(text)
            (folder / key).chmod(0o644)
        mounts[folder] = mount["mountPath"]
    return mounts


@pytest.fixture
def fake_engines() -> Iterator[tuple[int, int]]:
    prefill, decode = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdx_router.testing.fake_engine", "--prefill-port", str(prefill),
         "--decode-port", str(decode), "--output-tokens", "8"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and "ready" in proc.stdout.readline()
        yield prefill, decode
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _stop(proc: subprocess.Popen[bytes] | asyncio.subprocess.Process) -> None:
    """End `buildah run` and what it started (its own process group)."""
    if proc.returncode is None:
        os.killpg(proc.pid, signal.SIGTERM)


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except OSError:
        return 0


async def test_router_image_serves_a_streamed_conversation_with_reuse_on_turn_two(
    images: dict[str, Image], fake_engines: tuple[int, int], tmp_path: Path
) -> None:
    prefill, decode = fake_engines
    port = free_port()
    target = load(_seed(port))
    generation = config_hash(target)
    ready = [
        ready_engine("prefill", f"{target.name}-prefill-0", "127.0.0.1", generation, port=prefill),
        ready_engine("decode", f"{target.name}-decode-0", "127.0.0.1", generation, port=decode),
    ]
    objects = render(target, ready)
    mounts = _mounted_configs(objects, tmp_path / "volumes")
    container_spec = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    image = images["router"]
    assert container_spec["args"] == image.config()["Cmd"]  # the kubelet runs ENTRYPOINT + args
    argv = [*image.config()["Entrypoint"], *container_spec["args"]]
    url = f"http://127.0.0.1:{port}"
    with container(image) as ctr:
        proc = subprocess.Popen(run_argv(ctr, argv, mounts=mounts), stderr=subprocess.PIPE, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while _get(url + "/ready") != 200:
                assert proc.poll() is None, (proc.stderr.read() if proc.stderr else b"").decode()
                assert time.monotonic() < deadline, "router image never became ready"
                await asyncio.sleep(0.2)
            assert _get(url + "/health") == 200
            await _two_streamed_turns(url, target.spec.model.served_name)
        finally:
            _stop(proc)
            proc.wait(timeout=20)


CLIENT_KEY = {"Authorization": "Bearer image-test-client"}


async def _two_streamed_turns(url: str, model: str) -> None:
    messages = [user(LONG)]
    reused = []
    async with aiohttp.ClientSession() as http:
        for _turn in range(2):
            body = {"model": model, "messages": messages, "stream": True, "conversation_id": "image-c1"}
            async with http.post(url + "/v1/chat/completions", json=body, headers=CLIENT_KEY) as resp:
                assert resp.status == 200, await resp.text()
                lines = [ln for ln in (await resp.read()).split(b"\n") if ln.startswith(b"data: ")]
                reused.append(int(resp.headers.get("X-PDX-Reused-Tokens", "0")))
            answer = stream_text(lines)
            assert answer and lines[-1] == b"data: [DONE]"
            messages += [assistant(answer), user("and then? " + LONG)]
        stats = await (await http.get(url + "/v1/pdx/stats")).json()
    assert reused[0] == 0 and reused[1] >= 64, reused
    # The seed is a GPU resource, so a short follow-up is prefilled on its decode (decode-local).
    assert stats["reuse"]["local"] == 1 and stats["reuse"]["hit"] == 0 and stats["reuse"]["miss"] == 1, stats


# -- the operator image reconciles a resource on the session's real control plane -----------


@dataclass
class Running:
    proc: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        assert self.proc.poll() is None, (
            f"operator image exited {self.proc.returncode}: {self.log.read_text()[-3000:]}"
        )
        return True


@pytest.fixture
def operator_image(
    images: dict[str, Image], control_plane: ControlPlane, cluster: Cluster, tmp_path: Path
) -> Iterator[Running]:
    """The operator image's own ENTRYPOINT and CMD (every namespace), logged in to the session's
    control plane through a mounted kubeconfig: a client certificate from its CA, in
    system:masters (the chart's own identity is the user flow's, tests/cluster/test_user_flow.py).
    Stopped before ``cluster`` removes what it made."""
    folder = tmp_path / "kube"
    folder.mkdir(mode=0o755)
    host = json.loads(control_plane.user_kubeconfig("pdx-operator-image", ["system:masters"]).read_text())
    user = host["users"][0]["user"]
    files = {
        "ca.crt": host["clusters"][0]["cluster"]["certificate-authority"],
        "client.crt": user["client-certificate"],
        "client.key": user["client-key"],
    }
    for name, source in files.items():
        shutil.copyfile(source, folder / name)
        (folder / name).chmod(0o644)  # read by the image's user; a test CA's key, gone with the session
    inside = Path("/etc/kube")
    write_kubeconfig(
        folder / "config",
        control_plane.url,  # loopback: `buildah run` shares the host's network
        inside / "ca.crt",
        {"client-certificate": str(inside / "client.crt"), "client-key": str(inside / "client.key")},
    )
    (folder / "config").chmod(0o644)
    image = images["operator"]
    log = tmp_path / "operator.log"
    with container(image) as ctr, log.open("wb") as out:
        argv = run_argv(ctr, image.argv(), mounts={folder: str(inside)}, env={"KUBECONFIG": str(inside / "config")})
        proc = subprocess.Popen(argv, stdout=out, stderr=out, start_new_session=True)
        try:
            yield Running(proc, log)
        finally:
            # buildah run forwards the TERM, then reports the stopped command as "killed" (exit
            # 1); a crash while running fails the test's own checks.
            proc.poll()
            _stop(proc)
            proc.wait(timeout=30)


def test_operator_image_applies_the_children_and_writes_status(
    operator_image: Running, cluster: Cluster, images: dict[str, Image]
) -> None:
    """The image's kopf, from its own CMD, reconciles a resource on the real API server: every
    child applied and owned by it, pods made by the real controllers and Ready through kwok,
    and the status (READY True, 2/2 per role) written through the status subresource."""
    liveness = next(a for a in images["operator"].argv() if a.startswith("--liveness="))
    port = int(liveness.rsplit(":", 1)[1].split("/")[0])  # --liveness=http://0.0.0.0:PORT/healthz
    alive = operator_image.alive
    cr = cluster.create(cr_document(NAME, cluster.ns))

    def applied() -> dict[tuple[str, str], dict[str, Any]] | None:
        children = cluster.children(NAME) if alive() else {}
        return children if set(children) == expected_children(NAME) else None

    children = wait_for("the children", applied, timeout=90)
    assert all(c["metadata"]["ownerReferences"][0]["uid"] == cr["metadata"]["uid"] for c in children.values())
    status = wait_for(
        "status READY with every pod",
        lambda: (
            alive()
            and (st := cluster.status(NAME)).get("ready") == "True"
            and st.get("decode", {}).get("summary") == "2/2"
            and st
        ),
        timeout=120,
    )
    assert status["observedGeneration"] == 1
    assert status["prefill"]["summary"] == "2/2"
    assert {c["type"] for c in status["conditions"]} >= {"Ready", "Progressing"}
    assert len(cluster.published(NAME)) == 4  # both prefills and both decodes, Ready
    assert _get(f"http://127.0.0.1:{port}/healthz") == 200
