#!/usr/bin/env bash
# The GPU figures of docs/results/h200-*: `pdx bench --local` on examples/local-gpu.yaml, run on a
# GPU machine after scripts/gpu-install.sh (docs/gpu.md). Everything lands in OUT_DIR, packed as
# OUT_DIR.tgz at the end (records, reports, plots, the engines' and router's logs).
#
#   gpu-bench.sh OUT_DIR [sweep] [load] [tokenize] [FIELD=VALUE...]
#     sweep  one client, OFF then ON (and the lower bound), 3 conversations x 4 turns at $LENGTHS
#     tokenize  ON with the engines' tokenize cache (64Mi, the default) and without it, side by side
#            at $VARIANT_LENGTHS (8000,24000 here)
#     load   8 clients, 16 conversations x 4 turns at 16k tokens, the legs in $LOAD_LEGS
#     held   one client, OFF then ON, 3 conversations x 4 turns at $HELD_LENGTHS (24000,32000), on
#            examples/local-gpu-overcommit.yaml (decode keeps 101,888 tokens, as on the H100): the
#            sweep's end, where held KV outgrows decode's cache (issue 41), without the bound
#     held-load  the load run on that resource: 16 conversations of 16k hold 2.6x what decode keeps
#     FIELD=VALUE  the ON leg at $VARIANT_LENGTHS on the resource with one spec field changed
#            (a dotted camelCase path under spec, e.g. kvTransfer.blockSize=128), without the bound;
#            several joined by + change together (router.decodeLocalMaxTokens=0+kvTransfer.blockSize=128)
#
# Environment: LENGTHS (2000,8000,16000,24000,32000), LOAD_LEGS (off,on), VARIANT_LENGTHS
# (16000,24000), PYTHON (python3), CR (examples/local-gpu.yaml).
set -uo pipefail
out=${1:?usage: gpu-bench.sh OUT_DIR [sweep] [load] [CR files...]}
shift
mkdir -p "$out"
PY=${PYTHON:-python3}
CR=${CR:-examples/local-gpu.yaml}
LENGTHS=${LENGTHS:-2000,8000,16000,24000,32000}
state=${PDX_CACHE:-$HOME/.cache/pdx}/local

# The resource with one spec field set: FIELD=VALUE -> a file in $out, its path printed.
variant() {
  "$PY" - "$CR" "$1" "$out" <<'PY'
import sys, yaml
cr, changes, out = sys.argv[1:]
doc = yaml.safe_load(open(cr))
names = []
for change in changes.split("+"):
    path, _, value = change.partition("=")
    node = doc["spec"]
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = yaml.safe_load(value)
    names.append(f"{path.replace('.', '-')}-{value}")
name = f"{out}/cr-{'+'.join(names)}.yaml"
yaml.safe_dump(doc, open(name, "w"), sort_keys=False)
print(name)
PY
}

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
    held) bench held -f examples/local-gpu-overcommit.yaml --lengths "${HELD_LENGTHS:-24000,32000}" --turns 4 \
      --conversations 3 --no-bound ;;
    held-load) bench held-load -f examples/local-gpu-overcommit.yaml --legs off,on --no-bound --lengths 16000 \
      --turns 4 --conversations 16 --concurrency 8 ;;
    tokenize) bench tokenize -f "$CR" --leg "tokcache:prefill.tokenizeCache=64Mi,decode.tokenizeCache=64Mi" \
      --leg "no-tokcache:prefill.tokenizeCache=0Mi,decode.tokenizeCache=0Mi" --no-bound \
      --lengths "${VARIANT_LENGTHS:-8000,24000}" --turns 4 --conversations 3 ;;
    *=*)
      cr=$(variant "$what") || exit 1
      bench "on-$(basename "$cr" .yaml)" -f "$cr" --legs on --no-bound --lengths "${VARIANT_LENGTHS:-16000,24000}" \
        --turns 4 --conversations 3
      ;;
    *) echo "gpu-bench.sh: unknown run $what (sweep, held, held-load, load, tokenize, FIELD=VALUE)" >&2 ;;
  esac
done
tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
echo "== packed $out.tgz ($(du -h "$out.tgz" | cut -f1))"
