#!/usr/bin/env bash
# One device call: e2e/overlap_probe.py (can a decode step overlap attention with its GEMMs?) on the
# W1 and W4 decode shapes, W4 at this commit, and on an H200 issue 19's W2 bf16 and FP8 pair.
#   PAGODA_COMMIT=<sha> bash e2e/run_overlap.sh OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT_DIR}
mkdir -p "$OUT"
# shellcheck disable=SC1091
source e2e/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
rc=0
echo "=== probe ($(date -u +%H:%M:%S))"
timeout 240 python3 e2e/overlap_probe.py --out "$OUT" || rc=1
echo "=== w4 ($(date -u +%H:%M:%S))"
timeout 150 python3 -m pagoda.runtime.cli bench throughput --workload W4 --backend pagoda --out "$OUT" || rc=1
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    echo "=== w2 ($(date -u +%H:%M:%S))"
    bash e2e/run_fp8.sh "$OUT" w2 || rc=1
fi
rm -f "$OUT"/*.png
ls -1 "$OUT"
exit $rc
