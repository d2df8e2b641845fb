#!/usr/bin/env bash
# Issue 34 on this machine: "why not just prefix caching?". Four legs, each an edit of the resource
# as a user would make it, over live conversations from well below to well above prefill's KV
# capacity (examples/local-cpu-prefix-cache.yaml: 32 blocks of 128 tokens a prefill), on 1P1D and
# 2P1D; then `pdx bench report-prefix-cache` puts both runs side by side.
#
#   cpu-prefix-cache.sh OUT_DIR
#
#   plain        kvTransfer.bidirectional=false, prefill.prefixCaching=false  (the seed's OFF)
#   cache        bidirectional=false, prefixCaching=true, router.prefillAffinity=true  (OFF+cache)
#   bidir        bidirectional=true, prefixCaching=false  (the seed's ON)
#   bidir-cache  bidirectional=true, prefixCaching=true, prefillAffinity=true  (ON+cache)
#
# Environment (defaults): LIVE (1,2,3,5,8), TURNS (4), PREFIX (1024 tokens, each conversation its
# own), THINK (3 s between a turn's answer and the next), TOPOLOGIES (1 2: prefill replicas),
# LOCK (/tmp/pdx-engines.lock: one engine run at a time on this machine). Each leg starts its own
# engines (~1 min for 1P1D, ~2 for 2P1D on 2 cores).
set -uo pipefail
out=${1:?usage: cpu-prefix-cache.sh OUT_DIR}
mkdir -p "$out"
PDX=${PDX:-.venv/bin/pdx}
LOCK=${LOCK:-/tmp/pdx-engines.lock}
off="kvTransfer.bidirectional=false"
on="kvTransfer.bidirectional=true"
cached="prefill.prefixCaching=true,router.prefillAffinity=true"
uncached="prefill.prefixCaching=false,router.prefillAffinity=false"
runs=()
for p in ${TOPOLOGIES:-1 2}; do
  run="$out/${p}p1d"
  flock "$LOCK" "$PDX" bench -f examples/local-cpu-prefix-cache.yaml --local --set "prefill.replicas=$p" \
    --leg "plain:$off,$uncached" --leg "cache:$off,$cached" \
    --leg "bidir:$on,$uncached" --leg "bidir-cache:$on,$cached" \
    --lengths "${PREFIX:-1024}" --unique-prefix --turns "${TURNS:-4}" --live "${LIVE:-1,2,3,5,8}" \
    --think-time "${THINK:-3}" --no-bound --out "$run" 2>"$run.stderr" | tee "$run.log"
  runs+=("$run")
done
"$PDX" bench report-prefix-cache "${runs[@]}" --out "$out"
