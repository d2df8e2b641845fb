"""Which build of the data path runs: compiled (mypyc) or the pure-Python modules.

The modules a request and its relayed chunks pass through (`COMPILED`) are compiled by
`scripts/build_router_native.py` into `_native/`, beside a manifest of the digests of every
source they were compiled from. A compiled module would shadow its `.py` if it sat beside
it, so that an edit ran stale code; kept apart, it is put in front of the package's path only
while the manifest matches the sources (`state`). Otherwise, or with `PDX_ROUTER_PURE=1`,
the `.py` files run, and the router's start-up log says why.

Standard library only: the package's `__init__` imports this before anything else.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from pathlib import Path

# pdx_router's modules that mypyc compiles: those a request and its relayed chunks pass through
# (`answer`: every block of a turn kept by its history). Not the store (tests replace its
# methods), nor what runs once or off the request's path.
COMPILED = (
    "wire", "relay", "filters", "front", "app", "upstream", "metrics", "ids", "entries", "endpoints", "answer",
)  # fmt: skip
# Modules written in C beside a `.py` twin of the same name (what runs unbuilt or pure).
C_MODULES = ("scan",)
BUILT = (*COMPILED, *C_MODULES)  # every module a build holds, as its manifest lists them
HERE = Path(__file__).resolve().parent
FOLDER = "_native"  # the build's folder inside the package
NATIVE_DIR = HERE / FOLDER
MANIFEST = "manifest.json"
PURE_ENV = "PDX_ROUTER_PURE"


def sources(package_dir: Path = HERE) -> dict[str, str]:
    """sha256 of every module of the package (and of the C sources): a compiled module
    depends on the types of the modules it imports, so any edit makes the build stale."""
    return {
        p.relative_to(package_dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted([*package_dir.rglob("*.py"), *package_dir.rglob("*.c")])
        if FOLDER not in p.parts
    }


def manifest(package_dir: Path = HERE) -> dict[str, object]:
    """What a build records of the sources and interpreter it was made from."""
    abi = sysconfig.get_config_var("EXT_SUFFIX")
    return {"abi": abi, "modules": list(BUILT), "sources": sources(package_dir)}


def state(package_dir: Path = HERE, env: dict[str, str] | None = None) -> str:
    """'compiled', or why the pure-Python modules run (one line, with the fix)."""
    env = dict(os.environ) if env is None else env
    if env.get(PURE_ENV, "") not in ("", "0"):
        return f"pure Python ({PURE_ENV} is set)"
    path = package_dir / FOLDER / MANIFEST
    if not path.exists():
        return "pure Python (not compiled; scripts/build_router_native.py compiles it)"
    built = json.loads(path.read_bytes())
    if built.get("abi") != sysconfig.get_config_var("EXT_SUFFIX") or built.get("modules") != list(BUILT):
        return "pure Python (compiled for another Python or module list; rebuild: scripts/build_router_native.py)"
    old: dict[str, str] = built.get("sources", {})
    now = sources(package_dir)
    changed = sorted(name for name in old.keys() | now.keys() if old.get(name) != now.get(name))
    if changed:
        more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
        return f"pure Python ({changed[0]}{more} changed since the build; rebuild: scripts/build_router_native.py)"
    return "compiled"
