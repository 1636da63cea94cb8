#!/usr/bin/env bash
# Issue 16's W4 work on heads of 64, in one device call:
#   PAGODA_COMMIT=<sha> bash e2e/run_narrow_heads.sh OUT_DIR [stage ...]
# stages (default: w4 w2 correct), in the order given:
#   probe    e2e/overlap_probe.py: can a decode step overlap attention with its GEMMs? (results/overlap-416cfd5/)
#   decode   e2e/decode_tile_sweep.py --w4-ab: decode launches for heads of 64, W4 with the best (results/decode-tiles-c51f612/)
#   prefill  e2e/prefill_tile_sweep.py --w4-ab: prefill launches for heads of 64, the same (results/prefill-tiles-*/)
#   ab       e2e/w4_ab.py: W4 in one process with and without --gemm-glu (AB_VARIANTS: its --variant
#            arguments, space-separated, no spaces inside; default base glu glu2k base)
#   kernels  e2e/profile_w4.py --kernels 1024 without and with --gemm-glu: W4's GPU time per step kind
#            and its kernel table, so the fused GEMM's in-place time shows (results/glu-ab-6964212/)
#   steps    e2e/profile_w4.py --seats 1024: GPU time and the host's idle per step kind (where a card's
#            wall time goes beyond its GPU time; on the H200 the profiler's busy share was 61-81%), then
#            the same with --prefill-short-context 0 (3caf23a's tile by context length off), then on again
#   w4       W4 through `pagoda bench` with the profiler's GPU-busy figure (W4_TWICE=1: a second run,
#            the card's spread beside the figure)
#   budget   W4 (then W1 with W1_BUDGET=1) through `pagoda bench` at each of BUDGETS' per-step token
#            budgets (default 16384 32768 16384 32768): fewer, larger mixed steps, fewer steps in all
#            (32k was level with 16k on W4: results/feed-ab-172915a/)
#   glu      profile_w4.py --seats 1024 without and with --gemm-glu, twice, alternating (GPU time per
#            step kind: the wall clock could not rank the two, results/glu-ab-6964212/)
#   w2       issue 19's W2 bf16 and FP8 pair, on an H200 only (its target is an H200 figure)
#   correct  e2e/gpu_correctness.py --llama-layers 8 (the 0.5B shape has heads of 64)
# Earlier calls ran these as run_overlap.sh (probe w4 w2), run_decode_tiles.sh (decode w2) and
# run_prefill_tiles.sh (prefill w2).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT_DIR}; shift
STAGES=("$@"); [ ${#STAGES[@]} -gt 0 ] || STAGES=(w4 w2 correct)
mkdir -p "$OUT"
# shellcheck disable=SC1091
source e2e/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
quiet() { grep -v "regex pattern"; }  # transformers 5.17's tokenizer warning, once per load
w4() { timeout 200 python3 -m pagoda.runtime.cli bench throughput --workload W4 --backend pagoda --out "$OUT" "$@"; }
stage_probe() { timeout 240 python3 e2e/overlap_probe.py --out "$OUT"; }
stage_decode() { timeout 420 python3 e2e/decode_tile_sweep.py --w4-ab --out "$OUT" 2>&1 | quiet; }
stage_prefill() { timeout 470 python3 e2e/prefill_tile_sweep.py --w4-ab --out "$OUT" 2>&1 | quiet; }
stage_ab() {
    local v=(); for x in ${AB_VARIANTS:-}; do v+=(--variant "$x"); done
    timeout 420 python3 e2e/w4_ab.py --out "$OUT" "${v[@]}" 2>&1 | quiet
}
stage_kernels() {
    local g
    for g in "" --gemm-glu; do
        timeout 220 python3 e2e/profile_w4.py --out "$OUT" --seats 1024 --kernels 1024 $g 2>&1 | quiet \
            | grep -iE "after start-up|by_kind|^kernels|^ +[0-9.]+ ms" | cut -c1-800 | head -60
    done
}
stage_steps() {
    local s i=0
    for s in "" "--prefill-short-context 0" ""; do
        i=$((i + 1)); echo "--- profile_w4 $s"
        timeout 200 python3 e2e/profile_w4.py --out "$OUT" --seats 1024 --tag "run$i" $s 2>&1 | quiet \
            | grep -iE "after start-up|by_kind|wrote" | cut -c1-1500 | head -20
    done
}
stage_w4() {
    w4 --gpu-busy 1024 2>&1 | quiet || return 1
    [ "${W4_TWICE:-0}" = 1 ] || return 0
    w4 2>&1 | quiet
}
stage_budget() {
    local b
    for b in ${BUDGETS:-16384 32768 16384 32768}; do
        echo "--- W4 --max-num-batched-tokens $b"
        w4 --max-num-batched-tokens "$b" 2>&1 | quiet | grep -E "^W4|roofline|rror"
    done
    [ "${W1_BUDGET:-0}" = 1 ] || return 0
    for b in ${BUDGETS:-16384 32768}; do
        echo "--- W1 --max-num-batched-tokens $b"
        timeout 200 python3 -m pagoda.runtime.cli bench throughput --workload W1 --backend pagoda --out "$OUT" \
            --max-num-batched-tokens "$b" 2>&1 | quiet | grep -E "^W1|roofline|rror"
    done
}
stage_glu() {
    local g i=0
    for g in "" --gemm-glu "" --gemm-glu; do
        i=$((i + 1)); echo "--- profile_w4 $g"
        timeout 200 python3 e2e/profile_w4.py --out "$OUT" --seats 1024 --tag "ab$i" $g 2>&1 | quiet \
            | grep -iE "after start-up|by_kind|wrote" | cut -c1-1500 | head -20
    done
}
stage_w2() {
    nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "w2: not an H200, skipped"; return 0; }
    bash e2e/run_fp8.sh "$OUT" w2
}
stage_correct() {
    timeout 300 python3 e2e/gpu_correctness.py --llama-layers 8 \
        --out "$OUT/gpu-correctness-${PAGODA_COMMIT:-local}.json" 2>&1 | quiet | tail -40
}
rc=0
for stage in "${STAGES[@]}"; do
    echo "=== $stage ($(date -u +%H:%M:%S))"
    "stage_$stage" || { echo "stage $stage failed" >&2; rc=1; }
done
rm -f "$OUT"/*.png
ls -1 "$OUT"
exit $rc
