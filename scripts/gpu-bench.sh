#!/usr/bin/env bash
# The GPU figures of docs/results/h200-*: `pdx bench --local` on examples/local-gpu.yaml, run on a
# GPU machine after scripts/gpu-install.sh (docs/gpu.md). Everything lands in OUT_DIR, packed as
# OUT_DIR.tgz at the end (records, reports, plots, the engines' and router's logs).
#
#   gpu-bench.sh OUT_DIR [sweep] [load] [extra CR files...]
#     sweep  one client, OFF then ON (and the lower bound), 3 conversations x 4 turns at $LENGTHS
#     load   8 clients, 16 conversations x 4 turns at 16k tokens, the legs in $LOAD_LEGS
#     FILE   the sweep's ON leg again on another resource (e.g. a changed engine setting)
#
# Environment: LENGTHS (2000,8000,16000,24000,32000), LOAD_LEGS (off,on), PYTHON (python3),
# CR (examples/local-gpu.yaml).
set -uo pipefail
out=${1:?usage: gpu-bench.sh OUT_DIR [sweep] [load] [CR files...]}
shift
mkdir -p "$out"
PY=${PYTHON:-python3}
CR=${CR:-examples/local-gpu.yaml}
LENGTHS=${LENGTHS:-2000,8000,16000,24000,32000}
state=${PDX_CACHE:-$HOME/.cache/pdx}/local

pdx() { "$PY" -c 'import sys, pdx_cli; sys.argv[0] = "pdx"; pdx_cli.main()' "$@"; }

# One bench run: its output folder, its log, and the topology's logs copied beside them.
bench() {
  local name=$1
  shift
  local t0=$SECONDS
  echo "== $name: pdx bench $*"
  pdx bench --local "$@" --out "$out/$name" >"$out/$name.log" 2>&1
  echo "== $name: exit $? after $((SECONDS - t0)) s"
  grep -A12 "^TTFT in ms" "$out/$name.log" || tail -20 "$out/$name.log"
  mkdir -p "$out/$name/logs"
  cp -r "$state"/*/logs/. "$out/$name/logs/" 2>/dev/null
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/gpu.txt" 2>&1
"$PY" -c 'import importlib.metadata as m; print(*(f"{d} {m.version(d)}" for d in ("vllm", "nixl_cu13", "torch")))' \
  >>"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
for what in "${@:-sweep}"; do
  case $what in
    sweep) bench sweep -f "$CR" --lengths "$LENGTHS" --turns 4 --conversations 3 ;;
    load) bench load -f "$CR" --legs "${LOAD_LEGS:-off,on}" --no-bound --lengths 16000 --turns 4 --conversations 16 \
      --concurrency 8 ;;
    *) bench "on-$(basename "$what" .yaml)" -f "$what" --legs on --lengths "$LENGTHS" --turns 4 --conversations 3 ;;
  esac
done
tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
echo "== packed $out.tgz ($(du -h "$out.tgz" | cut -f1))"
