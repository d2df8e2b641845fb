#!/usr/bin/env bash
# Greedy correctness of bidirectional KV reuse on a GPU machine (issue 31, docs/gpu.md): the seeded
# local model of examples/local-gpu-correct.yaml, run by the local runtime on the GPU with
# bidirectional off, then on, through pdx's engine plugins; outputs compared token id for token
# id, edited histories, plugin lines (tests/e2e/correctness.py). After scripts/gpu-install.sh and
# `source /tmp/site/pdx-env.sh`:
#
#   gpu-correct.sh OUT_DIR [FIELD=VALUE ...]
#
# FIELD=VALUE sets one spec field of the CR for this run (a dotted camelCase path under spec, a
# YAML value: model.dtype=bfloat16, 'model.extraArgs=[--enforce-eager]'). OUT_DIR gets
# summary.json and summary.md (every figure), gpu.txt, and both runs' logs (off/logs, on/logs).
# Exit 0: every check passed; 1: a check failed; 2: the run could not finish (OUT_DIR/error.txt);
# 124: out of time (the engines are stopped first, their logs kept).
# Environment: PYTHON (python3), CR (examples/local-gpu-correct.yaml), TOLERANCE (1e-3, the
# largest |logprob on - off| allowed), LIMIT_S (540: under a 600 s command limit), FIRST_TOKEN
# (1: a third run with prefill's first token streamed, router.firstTokenFromPrefill; OUT_DIR/first).
set -uo pipefail
[[ $# -ge 1 ]] || {
  sed -n '8,17p' "$0" >&2
  exit 2
}
mkdir -p "$1" && out=$(cd "$1" && pwd) || exit 2
shift
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
# This checkout's code before the pdx that gpu-install.sh copied into the site, which may be older;
# vLLM still finds the engine plugins by that install's entry points.
export PYTHONPATH="$PWD/operator:$PWD/contract:$PWD/engine:$PWD/router:$PWD/benchmark:$PWD/cli${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/gpu.txt" 2>&1
"$PY" -c 'import importlib.metadata as m; print(*(f"{d} {m.version(d)}" for d in ("vllm", "nixl_cu13", "torch")))' \
  >>"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
args=(--out "$out" -f "${CR:-examples/local-gpu-correct.yaml}")
[[ -z ${TOLERANCE:-} ]] || args+=(--tolerance "$TOLERANCE")
[[ ${FIRST_TOKEN:-0} != 1 ]] || args+=(--first-token)
for setting in "$@"; do
  args+=(--set "$setting")
done
start=$SECONDS
timeout -k 30 "${LIMIT_S:-540}" "$PY" -m tests.e2e.correctness "${args[@]}"
rc=$?
echo "== gpu-correct: exit $rc after $((SECONDS - start)) s; $out/summary.md"
exit $rc
