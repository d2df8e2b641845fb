#!/usr/bin/env python3
"""Compile pdx-router's data path with mypyc into router/pdx_router/_native/.

    .venv/bin/python scripts/build_router_native.py [--force] [--check]

The modules in `pdx_router.native.COMPILED` (the relay of decode's stream, the HTTP of
both sides, the stream filter) take 11-17% off the router's CPU per request under load
(docs/results/router-bench.md). The build writes the compiled extensions and a manifest of
the sources' digests; `pdx_router` imports them only while the manifest matches, so an edit
runs the `.py` files until the next build. Nothing is rebuilt when the manifest matches.

Needs mypy (the test extra, or images/router/build-requirements.txt), a C compiler and the
interpreter's headers. mypy type-checks what the compiled modules import, so the router's
dependencies must be installed in the interpreter that runs this script.
--check: exit 1 when the build is missing or stale, build nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROUTER = Path(__file__).resolve().parent.parent / "router"
sys.path.insert(0, str(ROUTER))
sys.path.insert(1, str(ROUTER.parent / "contract"))

from pdx_router import native  # noqa: E402  (from this tree, whatever is installed)


def build(out: Path) -> None:
    """mypycify + setuptools' build_ext, in a scratch directory; the extensions land in `out`."""
    from mypyc.build import mypycify
    from setuptools import Extension, setup  # type: ignore[import-untyped]

    files = [f"pdx_router/{name}.py" for name in native.COMPILED]
    made = native.manifest()  # before compiling: an edit during the build leaves it stale
    with tempfile.TemporaryDirectory(prefix="pdx-mypyc-") as tmp:
        os.environ["MYPY_CACHE_DIR"] = str(Path(tmp) / "mypy-cache")
        cwd = Path.cwd()
        os.chdir(ROUTER)  # module names come from the paths: pdx_router.wire, ...
        try:
            # One group named inside the package: its shared library is pdx_router._native__mypyc,
            # found through the package's path like the modules' own shims.
            said = io.StringIO()
            try:
                with contextlib.redirect_stdout(said):
                    exts = mypycify(files, opt_level="3", group_name="pdx_router._native", target_dir=f"{tmp}/c")
            except SystemExit:  # mypyc's errors went to `said`: show them, or the build fails mute
                print(said.getvalue(), end="", file=sys.stderr)
                raise
            # mypyc's notes that a generator is compiled as a list say nothing to do; the rest is shown.
            notes = said.getvalue().splitlines(True)
            print("".join(line for line in notes if "Treating generator" not in line), end="")
            # The C modules beside them, each its own extension (pdx_router.scan, ...).
            exts += [
                Extension(f"pdx_router.{name}", [f"pdx_router/{name}.c"], extra_compile_args=["-O2"])
                for name in native.C_MODULES
            ]
            setup(
                name="pdx-router-native",
                ext_modules=exts,
                script_args=["-q", "build_ext", "--build-lib", f"{tmp}/lib", "--build-temp", f"{tmp}/obj"],
            )
        finally:
            os.chdir(cwd)
        built = sorted((Path(tmp) / "lib" / "pdx_router").glob("*.so"))
        expected = len(native.COMPILED) + 1 + len(native.C_MODULES)  # + mypyc's shared library
        if len(built) != expected:
            raise SystemExit(f"build_router_native: expected {expected} extensions, got {built}")
        staging = out.with_name(out.name + ".new")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        for so in built:
            shutil.copy2(so, staging / so.name)
        (staging / native.MANIFEST).write_text(json.dumps(made, indent=1) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--force", action="store_true", help="rebuild even if the build matches the sources")
    ap.add_argument("--check", action="store_true", help="only say whether the build is current (exit 1 if not)")
    args = ap.parse_args()
    now = native.state(env={})
    if args.check:
        print(f"pdx-router data path: {now}")
        raise SystemExit(0 if now == "compiled" else 1)
    if now == "compiled" and not args.force:
        print("pdx-router data path: compiled, current")
        return
    t0 = time.monotonic()
    build(native.NATIVE_DIR)
    after = native.state(env={})
    if after != "compiled":
        raise SystemExit(f"build_router_native: built, but {after}")
    names = ", ".join([*native.COMPILED, *(f"{name} (C)" for name in native.C_MODULES)])
    print(f"pdx-router data path: compiled {names} in {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
