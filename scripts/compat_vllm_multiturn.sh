#!/usr/bin/env bash
# Run vLLM's own multi-turn benchmark (from the vLLM sdist, fetched at run time, never
# committed) with --send-conversation-id against a running pdx router, run `pdx bench`'s client
# on the same workload, and compare the two sets of records. See docs/benchmark.md.
#
#   scripts/compat_vllm_multiturn.sh ROUTER_URL MODEL_DIR SERVED_MODEL_NAME [compat options]
#
# e.g. against `pdx local up`:  scripts/compat_vllm_multiturn.sh http://127.0.0.1:8000 \
#        ~/.cache/pdx/models/pdx-tiny pdx-tiny --out bench-results/compat
set -euo pipefail
if [[ $# -lt 3 ]]; then
  sed -n '2,8p' "$0" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
url=$1 model_dir=$2 name=$3
shift 3
exec "$PY" -m pdx_bench.compat --url "$url" --model-dir "$model_dir" --served-model-name "$name" "$@"
