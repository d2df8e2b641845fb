#!/usr/bin/env bash
# One GPU session's runs, most wanted first (docs/gpu.md): each lands in OUT_DIR/<run> when it
# ends, so a session cut short keeps what finished. Run after scripts/gpu-install.sh and
# `source /tmp/site/pdx-env.sh`, in the background, and pack OUT_DIR from later device calls.
#
#   gpu-session.sh OUT_DIR
#
# RUNS (sweep tokenize load; also correct decode-local variants):
#   sweep         gpu-bench.sh sweep: OFF, ON and the bound at $LENGTHS (2000,8000,16000,24000,32000)
#   tokenize      gpu-bench.sh tokenize: ON with and without the engines' tokenize cache
#   correct       gpu-correct.sh: greedy ON == OFF on the seeded model, edited histories, plugins
#   decode-local  gpu-decode-local.sh: D->P against decode-local per suffix and history length
#   graphs32      the same with decode's CUDA graphs as vLLM sizes them for maxNumSeqs 16 (up to 32
#                 tokens, docs/results/h200-2026-12-04): beside decode-local, what the rendered
#                 max_cudagraph_capture_size does to a local turn's TTFT and the streams' stall
#   variants      gpu-bench.sh: ON through prefill (decodeLocalMaxTokens 0) at 64- and 128-token blocks
#   load          gpu-bench.sh load: OFF and ON ($LOAD_LEGS) under 8 clients, 16 conversations at 16k
#   held          gpu-bench.sh held held-load: OFF and ON at 24k and 32k, and under load, with decode's
#                 cache at the H100's 101,888 tokens, where held KV outgrows it (issue 41)
set -uo pipefail
out=${1:?usage: gpu-session.sh OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/.." || exit 2

step() {
  local name=$1
  shift
  echo "== $(date +%T) $name: $*" >>"$out/session.log"
  "$@" >"$out/$name.out" 2>&1
  echo "== $(date +%T) $name: exit $?" >>"$out/session.log"
}

for run in ${RUNS:-sweep tokenize load}; do
  case $run in
    sweep) LENGTHS=${LENGTHS:-2000,8000,16000,24000,32000} step sweep bash scripts/gpu-bench.sh "$out/bench" sweep ;;
    tokenize) step tokenize bash scripts/gpu-bench.sh "$out/tokenize" tokenize ;;
    held) step held bash scripts/gpu-bench.sh "$out/held" held held-load ;;
    correct) step correct bash scripts/gpu-correct.sh "$out/correct" ;;
    decode-local) step decode-local bash scripts/gpu-decode-local.sh "$out/decode-local" ;;
    graphs32)
      step graphs32 bash scripts/gpu-decode-local.sh "$out/graphs32" \
        'decode.extraArgs=["--compilation-config", "{\"max_cudagraph_capture_size\": 32}"]'
      ;;
    variants)
      step variants bash scripts/gpu-bench.sh "$out/variants" router.decodeLocalMaxTokens=0 \
        router.decodeLocalMaxTokens=0+kvTransfer.blockSize=128
      ;;
    load) LOAD_LEGS=${LOAD_LEGS:-off,on} step load bash scripts/gpu-bench.sh "$out/load" load ;;
    *) echo "gpu-session.sh: unknown run $run" >>"$out/session.log" ;;
  esac
done
echo "== $(date +%T) done" >>"$out/session.log"
