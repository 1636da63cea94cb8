#!/usr/bin/env bash
# One device call: e2e/prefill_tile_sweep.py --w4-ab (prefill-attention launches for heads of 64, then
# W4 with the runtime's rule and with the best launch), and on an H200 issue 19's W2 pair.
#   PAGODA_COMMIT=<sha> bash e2e/run_prefill_tiles.sh OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT_DIR}
mkdir -p "$OUT"
# shellcheck disable=SC1091
source e2e/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
rc=0
echo "=== sweep ($(date -u +%H:%M:%S))"
timeout 470 python3 e2e/prefill_tile_sweep.py --w4-ab --out "$OUT" 2>&1 | grep -v "regex pattern" || rc=1
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    echo "=== w2 ($(date -u +%H:%M:%S))"
    bash e2e/run_fp8.sh "$OUT" w2 || rc=1
fi
rm -f "$OUT"/*.png
ls -1 "$OUT"
exit $rc
