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
# Environment (defaults): LIVE (1,2,4,6,8), TURNS (3), PREFIX (768 tokens, each conversation its
# own), THINK (4 s between a turn's answer and the next), LEASE (12 s: kvTransfer.kvLeaseDurationSeconds,
# all legs), TOPOLOGIES (1 2: prefill replicas), LOCK (/tmp/pdx-engines.lock: one engine run at a
# time on this machine). Each leg starts its own engines (~1 min for 1P1D, ~2 for 2P1D on 2 cores).
#
# The lease: prefill keeps a finished prefill's blocks until decode has read them, or the lease
# runs out. With 3,968 tokens of KV that is a few turns' worth: in a first run (lease 120 s,
# prefix 1024, 4 turns, 5 live) prefill logged "Running: 0 reqs, Waiting: 3 reqs, KV cache usage:
# 90%" for tens of seconds and follow-up turns waited up to 39 s, so the run measured admission,
# not the prefix cache. 12 s (blocks held at most 8 s past decode's last heartbeat) in every leg.
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
    --set "kvTransfer.kvLeaseDurationSeconds=${LEASE:-12}" \
    --leg "plain:$off,$uncached" --leg "cache:$off,$cached" \
    --leg "bidir:$on,$uncached" --leg "bidir-cache:$on,$cached" \
    --lengths "${PREFIX:-768}" --unique-prefix --turns "${TURNS:-3}" --live "${LIVE:-1,2,4,6,8}" \
    --think-time "${THINK:-4}" --no-bound --out "$run" 2>"$run.stderr" | tee "$run.log"
  runs+=("$run")
done
"$PDX" bench report-prefix-cache "${runs[@]}" --out "$out"
