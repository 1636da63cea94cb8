#!/usr/bin/env bash
# One device call for the gate|up GEMM's launch table (07b3212) and, on an H200, issue 19's W2 FP8:
#   PAGODA_COMMIT=<sha> bash e2e/run_glu_round2.sh OUT_DIR
# W4 without and with --gemm-glu first (the figure the table was made for), then W2 bf16 and FP8 where
# the card is an H200 (the target is an H200 figure), then the fused MLP's correctness, then W1 A/B.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT_DIR}
mkdir -p "$OUT"
bash e2e/run_gemm_glu.sh "$OUT" w4
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then bash e2e/run_fp8.sh "$OUT" w2; fi
bash e2e/run_gemm_glu.sh "$OUT" correct w1
