#!/usr/bin/env bash
# Issue 33's GPU figures: short follow-up turns through prefill with a D->P read, against the same
# turns prefilled on the decode that holds the conversation (decode-local), at several suffix and
# history lengths, with background streams decoding all along; then the default
# router.decodeLocalMaxTokens those numbers support (`pdx bench report-decode-local`). Run on a GPU
# machine after scripts/gpu-install.sh and `source /tmp/site/pdx-env.sh` (docs/gpu.md), with pdx
# installed from this tree. Everything lands in OUT_DIR, packed as OUT_DIR.tgz at the end.
#
#   gpu-decode-local.sh OUT_DIR [FIELD=VALUE ...]
#     FIELD=VALUE  a spec field set for both legs (a dotted camelCase path under spec)
#
# One topology start: the engines come up once (~100-130 s on the H200) for the D->P leg
# (router.decodeLocalMaxTokens=0); the local leg restarts only the router, with
# decodeLocalMaxTokens=$LOCAL_MAX_TOKENS, on the same engines (a router field is no part of their
# generation). Both legs set decodeLocalMaxBusy=$LOCAL_MAX_BUSY: the streams are in flight on
# decode, and at the default bound (4) they could keep every turn off decode-local.
#
# Environment (defaults): HISTORIES (8000,24000), SUFFIXES (128,512,1024), TURNS (5),
# CONVERSATIONS (4), STREAMS (3), STREAM_PROMPT (128), STREAM_OUTPUT (512),
# OUTPUT (32: tokens of each measured answer), LOCAL_MAX_TOKENS (8192), LOCAL_MAX_BUSY (8),
# TTL (30: decoderKvBlocksTtlSeconds for the run; every turn's KV stays held that long, and turns
# of a conversation follow within seconds), FIRST (dp; `local` runs the local leg first),
# PYTHON (python3), CR (examples/local-gpu.yaml).
set -uo pipefail
out=${1:?usage: gpu-decode-local.sh OUT_DIR [FIELD=VALUE ...]}
shift
mkdir -p "$out"
PY=${PYTHON:-python3}
CR=${CR:-examples/local-gpu.yaml}
# Fewer points, more turns each: a point's TPOT rise needs ~50 samples a leg for an interval
# narrower than the 10% it is judged by (docs/results/h200-2026-12-04: 6 to 90 points wide at ~27).
HISTORIES=${HISTORIES:-8000,24000}
SUFFIXES=${SUFFIXES:-128,512,1024}
STREAMS=${STREAMS:-3}
LOCAL_MAX_BUSY=${LOCAL_MAX_BUSY:-8}
state=${PDX_CACHE:-$HOME/.cache/pdx}/local

pdx() { "$PY" -c 'import sys, pdx_cli; sys.argv[0] = "pdx"; pdx_cli.main()' "$@"; }

# The run's resource: the CR with the TTL and the given fields set.
"$PY" - "$CR" "$out/cr.yaml" "kvTransfer.decoderKvBlocksTtlSeconds=${TTL:-30}" "$@" <<'PY' || exit 1
import sys, yaml
cr, dest, *changes = sys.argv[1:]
doc = yaml.safe_load(open(cr))
for change in changes:
    path, eq, value = change.partition("=")
    if not eq:
        sys.exit(f"gpu-decode-local.sh: expected FIELD=VALUE, got {change!r}")
    node = doc["spec"]
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = yaml.safe_load(value)
yaml.safe_dump(doc, open(dest, "w"), sort_keys=False)
PY

busy="router.decodeLocalMaxBusy=$LOCAL_MAX_BUSY"
dp="dp:router.decodeLocalMaxTokens=0,$busy"
local="local:router.decodeLocalMaxTokens=${LOCAL_MAX_TOKENS:-8192},$busy"
legs=(--leg "$dp" --leg "$local")
[ "${FIRST:-dp}" = local ] && legs=(--leg "$local" --leg "$dp")

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/gpu.txt" 2>&1
"$PY" -c 'import importlib.metadata as m; print(*(f"{d} {m.version(d)}" for d in ("vllm", "nixl_cu13", "torch")))' \
  >>"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"

args=(bench --local -f "$out/cr.yaml" "${legs[@]}" --no-bound --lengths "$HISTORIES" --suffix-tokens "$SUFFIXES"
  --turns "${TURNS:-5}" --conversations "${CONVERSATIONS:-4}" --output-tokens "${OUTPUT:-32}"
  --background-streams "$STREAMS" --background-prompt-tokens "${STREAM_PROMPT:-128}"
  --background-output-tokens "${STREAM_OUTPUT:-512}" --out "$out/run")
echo "== pdx ${args[*]}"
t0=$SECONDS
pdx "${args[@]}" >"$out/run.log" 2>&1
echo "== exit $? after $((SECONDS - t0)) s"
grep -q "^TTFT and background TPOT" "$out/run.log" && sed -n '/^TTFT and background TPOT/,/^records_/p' "$out/run.log" \
  || tail -20 "$out/run.log"
mkdir -p "$out/run/logs"
cp -r "$state"/*/logs/. "$out/run/logs/" 2>/dev/null
pdx bench report-decode-local "$out/run" | tee "$out/decode-local.txt"
cp "$out/run/decode-local.md" "$out/" 2>/dev/null
tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
echo "== packed $out.tgz ($(du -h "$out.tgz" | cut -f1))"
