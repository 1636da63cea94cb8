#!/usr/bin/env bash
# --gemm-glu (kernels/gemm_glu.py: the MLP's gate|up GEMM with silu(gate) * up in its epilogue) on one
# GPU, in one device call:
#   PAGODA_COMMIT=<sha> bash e2e/run_gemm_glu.sh OUT_DIR [stage ...]
# stages (default all, in this order):
#   bench    e2e/gemm_glu_gpu_bench.py: fused against cuBLAS + silu_and_mul on the W4 and 8B MLP shapes
#   correct  e2e/gpu_correctness.py --gemm-glu --llama-layers 8: logits and greedy text against transformers
#   w4       W4 without, then with --gemm-glu (the second names the first as its peer)
#   w1       W1 the same
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT_DIR}; shift
STAGES=("$@"); [ ${#STAGES[@]} -gt 0 ] || STAGES=(bench correct w4 w1)
mkdir -p "$OUT"
# shellcheck disable=SC1091
source e2e/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
newest() { ls -t "$OUT"/"$1"-2*.json 2>/dev/null | head -n 1; }
ab() {  # ab W4|W1: the workload without, then with --gemm-glu
    local w=$1 base
    timeout 200 python3 -m pagoda.runtime.cli bench throughput --workload "$w" --backend pagoda --out "$OUT" || return 1
    base=$(newest "$w-pagoda"); mv "$base" "${base%.json}-unfused.json"
    timeout 200 python3 -m pagoda.runtime.cli bench throughput --workload "$w" --backend pagoda --gemm-glu \
        --peer-result "${base%.json}-unfused.json" --out "$OUT"
}
stage_bench() { timeout 240 python3 e2e/gemm_glu_gpu_bench.py --out "$OUT"; }
stage_correct() { timeout 300 python3 e2e/gpu_correctness.py --gemm-glu --llama-layers 8 \
    --out "$OUT/gpu-correctness-gemm-glu-${PAGODA_COMMIT:-local}.json"; }
stage_w4() { ab W4; }
stage_w1() { ab W1; }
rc=0
for stage in "${STAGES[@]}"; do
    echo "=== $stage ($(date -u +%H:%M:%S))"
    "stage_$stage" || { echo "stage $stage failed" >&2; rc=1; }
done
rm -f "$OUT"/*.png
ls -1 "$OUT"
exit $rc
