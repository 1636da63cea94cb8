#!/usr/bin/env bash
# One device call for the narrow-head decode tile (kernels/paged_attention_decode.NARROW_HEAD_DIM):
# W4 through `pagoda bench` with the profiler's GPU-busy figure, GPU correctness against
# transformers (the 0.5B shape has heads of 64), and on an H200 issue 19's W2 pair.
#   PAGODA_COMMIT=<sha> bash e2e/run_narrow_heads.sh OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT_DIR}
mkdir -p "$OUT"
# shellcheck disable=SC1091
source e2e/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
rc=0
echo "=== w4 ($(date -u +%H:%M:%S))"
timeout 200 python3 -m pagoda.runtime.cli bench throughput --workload W4 --backend pagoda --gpu-busy 1024 \
    --out "$OUT" 2>&1 | grep -v "regex pattern" || rc=1
if [ "${W4_TWICE:-0}" = 1 ]; then  # the card's run-to-run spread, beside the figure
    timeout 200 python3 -m pagoda.runtime.cli bench throughput --workload W4 --backend pagoda \
        --out "$OUT" 2>&1 | grep -v "regex pattern" || rc=1
fi
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    echo "=== w2 ($(date -u +%H:%M:%S))"
    bash e2e/run_fp8.sh "$OUT" w2 || rc=1
fi
echo "=== correctness ($(date -u +%H:%M:%S))"
timeout 300 python3 e2e/gpu_correctness.py --llama-layers 8 \
    --out "$OUT/gpu-correctness-${PAGODA_COMMIT:-local}.json" 2>&1 | grep -v "regex pattern" | tail -40 || rc=1
rm -f "$OUT"/*.png
ls -1 "$OUT"
exit $rc
