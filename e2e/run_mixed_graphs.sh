#!/usr/bin/env bash
# Issue 17's mixed-step graphs on one H200, in one device call: the engine against transformers
# and against its own eager runs (gpu_correctness.py, the 8B shape cut to LAYERS layers), then W3
# at 16 req/s with piecewise graphs (the default) and with FULL_DECODE_ONLY, each its own server.
#   bash e2e/run_mixed_graphs.sh OUT_DIR        env: LAYERS (8), W3_REPEAT (2), W3_NUM_PROMPTS (512)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT_DIR}
mkdir -p "$OUT"
# shellcheck disable=SC1091
source e2e/gpu_env.sh
rc=0
timeout 200 python3 e2e/gpu_correctness.py --llama-layers "${LAYERS:-8}" --out "$OUT/gpu-correctness.json" \
    >"$OUT/gpu-correctness.txt" 2>&1 || rc=$?
tail -n 25 "$OUT/gpu-correctness.txt"
SERVER_LOG=$OUT/server-piecewise.log LOG_LEVEL=info W3_REPEAT=${W3_REPEAT:-2} \
    bash e2e/run_w3_peer.sh "$OUT/w3" pagoda 16 || rc=$?
SERVER_LOG=$OUT/server-decode-only.log LOG_LEVEL=info W3_REPEAT=1 \
    SERVE_ARGS="--compilation-config.cudagraph_mode FULL_DECODE_ONLY" \
    bash e2e/run_w3_peer.sh "$OUT/w3-decode-only" pagoda 16 || rc=$?
grep -h "captured\|profiled\|warm" "$OUT"/server-*.log | cut -c1-200
exit "$rc"
