"""The compiled data path runs only while its build matches the sources; an edit, another
interpreter or PDX_ROUTER_PURE=1 runs the `.py` files, and the state says why."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pdx_router import native

# scripts/test.sh builds the data path first and sets this: there, a missing or stale build
# is a failure, not a skip.
REQUIRED = os.environ.get("PDX_REQUIRE_NATIVE") == "1"


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A copy of pdx_router's sources with a manifest as a build writes it (no extensions)."""
    dst = tmp_path / "pdx_router"
    shutil.copytree(native.HERE, dst, ignore=shutil.ignore_patterns("_native*", "__pycache__", "*.so"))
    (dst / native.FOLDER).mkdir()
    (dst / native.FOLDER / native.MANIFEST).write_text(json.dumps(native.manifest(dst)))
    return dst


def test_a_build_that_matches_the_sources_is_used(package: Path) -> None:
    assert native.state(package, env={}) == "compiled"


def test_an_edited_module_makes_the_pure_modules_run_and_names_it(package: Path) -> None:
    ids = package / "ids.py"  # not compiled itself, but the compiled modules rely on its types
    ids.write_text(ids.read_text() + "\n# an edit\n")
    why = native.state(package, env={})
    assert why.startswith("pure Python (ids.py changed since the build")
    assert "scripts/build_router_native.py" in why


def test_a_new_module_makes_the_build_stale(package: Path) -> None:
    (package / "extra.py").write_text("X = 1\n")
    assert "extra.py changed since the build" in native.state(package, env={})


def test_an_edited_c_source_makes_the_build_stale(package: Path) -> None:
    scan = package / "scan.c"
    scan.write_text(scan.read_text() + "\n/* an edit */\n")
    assert native.state(package, env={}).startswith("pure Python (scan.c changed since the build")


def test_a_build_for_another_interpreter_is_not_used(package: Path) -> None:
    path = package / native.FOLDER / native.MANIFEST
    built = json.loads(path.read_text())
    path.write_text(json.dumps({**built, "abi": ".cpython-312-x86_64-linux-gnu.so"}))
    assert "compiled for another Python" in native.state(package, env={})


def test_no_build_and_the_pure_switch_each_say_so(package: Path) -> None:
    assert native.state(package, env={native.PURE_ENV: "1"}) == f"pure Python ({native.PURE_ENV} is set)"
    assert native.state(package, env={native.PURE_ENV: "0"}) == "compiled"
    shutil.rmtree(package / native.FOLDER)
    assert native.state(package, env={}).startswith("pure Python (not compiled;")


def _which(env: dict[str, str]) -> list[str]:
    code = (
        "import pdx_router, pdx_router.wire as w, pdx_router.app as a, pdx_router.store as s, pdx_router.scan as c\n"
        "print(pdx_router.NATIVE); print(w.__file__); print(a.__file__); print(s.__file__); print(c.__file__)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_the_router_imports_the_compiled_modules_when_built_and_the_py_files_when_told() -> None:
    built = native.state(env={})
    if built != "compiled" and not REQUIRED:
        pytest.skip(f"data path not built here: {built}")
    env = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
    state, wire, app, store, scan = _which(env)
    assert state == "compiled"
    assert Path(wire).parent == Path(app).parent == Path(scan).parent == native.NATIVE_DIR and wire.endswith(".so")
    assert scan.endswith(".so")  # scan.c, in front of its .py twin
    assert store.endswith("store.py")  # the rest of the router stays Python
    state, wire, app, _, scan = _which({**env, native.PURE_ENV: "1"})
    assert state.startswith("pure Python") and wire.endswith("wire.py") and app.endswith("app.py")
    assert scan.endswith("scan.py")


def test_metrics_say_which_data_path_runs() -> None:
    from pdx_router import NATIVE
    from pdx_router.metrics import Metrics

    samples = {
        s.labels["data_path"]: s.value
        for m in Metrics().registry.collect()
        if m.name == "pdx_router_build_info"
        for s in m.samples
    }
    assert samples == {"compiled" if NATIVE == "compiled" else "pure": 1.0}
