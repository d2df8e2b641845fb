#!/usr/bin/env bash
# Creates .venv at the repository root with pdx, its test tools and the CPU vLLM engines.
# The order matters: torch's CPU wheel first (else a CUDA build is pulled), then vLLM + NIXL,
# then the NIXL meta package without its CUDA deps, then drop three wheels that do not load
# against torch+cpu (torchcodec's OSError kills vLLM start-up).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet)
"${pip[@]}" --upgrade pip
"${pip[@]}" "torch==2.13.0+cpu"
"${pip[@]}" "torch==2.13.0+cpu" -e ".[operator,router,bench,engine,test]"
"${pip[@]}" --no-deps "nixl==1.5.1"
.venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
# The router's data path, compiled with mypyc (about 50 s; nothing when current). Without a
# C compiler the router runs its pure-Python modules, and says so when it starts.
headers=$(.venv/bin/python -c 'import os, sysconfig; print(os.path.join(sysconfig.get_paths()["include"], "Python.h"))')
if ! command -v cc >/dev/null || [ ! -f "$headers" ]; then
  (apt-get update -qq && apt-get install -y -qq gcc libc6-dev "lib$(basename "$(dirname "$headers")")-dev") >/dev/null 2>&1 || true
fi
.venv/bin/python scripts/build_router_native.py \
  || echo "pdx: the router's data path was not compiled; it runs as pure Python" >&2
echo "pdx: .venv ready ($(.venv/bin/python -c 'import vllm; print("vllm", vllm.__version__)'))"
# vLLM's multi-turn benchmark client (tests/e2e drives it): its source release's benchmarks/multi_turn
# and pandas, fetched with pip into ${PDX_CACHE:-~/.cache/pdx}, never into the repository or the venv.
.venv/bin/python -c 'import sys; from pdx_bench.compat import cache_dir, ensure_deps, obtain_sdist
obtain_sdist(); ensure_deps(sys.executable, cache_dir() / "vllm-bench-deps")'
