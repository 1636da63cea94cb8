#!/usr/bin/env bash
# Issue 19 on one H200: FP8 correctness on the Llama-3.1-8B shape, then W2 with FP8 weights and W1
# with FP8 weights and an FP8 KV cache, each beside its bf16 run in the same call (the ratios come
# from one machine), and optionally vLLM 0.26 with the same flags.
#
#   bash e2e/run_fp8.sh OUT_DIR [STAGE...]        STAGEs (default: correctness w2 w1), in the order given:
#     gemv         e2e/gemv_fp8_gpu_bench.py: the weight-only FP8 GEMV (1..4 rows) and the tensor-core small-M
#                  FP8 GEMM (1..16 rows) against quantize + torch._scaled_mm and the bf16 path on the 8B
#                  projections at 1, 2, 4, 8 rows, TB/s of 4.25, checked against their references, launches
#                  swept at one row; RMSNorm+quant fused vs unfused; prints FP8_SMALL_M entries, ~5 min
#                                                                                  -> gemv-fp8-pagoda-*.json
#     correctness  e2e/gpu_fp8.py: the FP8 GEMM (torch._scaled_mm, row-wise scales) against its fp32
#                  arithmetic at the 8B shapes, and FP8 / FP8+FP8-KV logits against bf16 and
#                  transformers bf16 (teacher forced), ~1.5 min      -> gpu-fp8-correctness-COMMIT.json
#     w2           W2 bf16, then W2 --quantization fp8 with the bf16 run as its peer, ~1.5 min
#                                                                 -> W2-pagoda-*.json, W2-pagoda-fp8-*.json
#     w1           W1 bf16, then W1 --quantization fp8 --kv-cache-dtype fp8 with the bf16 run as its
#                  peer (ratio_to_peer: the issue's >= 1.3x), ~3 min
#                                                         -> W1-pagoda-*.json, W1-pagoda-fp8-kvfp8-*.json
#     vllm         vLLM with the same flags (W2 fp8, W1 fp8 + fp8 KV), this call's Pagoda FP8 runs as the
#                  peers; installs vLLM from $VLLM_PARTS first (as run_w5.sh), ~4 min
#                                        -> W2-vllm-fp8-*.json, W1-vllm-fp8-kvfp8-*.json
#                  VLLM_W2=0 leaves out vLLM's W2 (its first start alone takes ~4 min of a 10-min call).
#                  VLLM=1 appends this stage when the list lacks it, so Pagoda's and vLLM's FP8 runs
#                  (and their ratios) come from one call; the vLLM parts must be on the machine first
#                  (../shared/tools/vllm-peer/README.md: one call per part of .vllm/; with this tree's
#                  size the parts must be cut smaller first: e2e/vllm_small_parts.sh).
# W2's FP8 run decodes through the path kernels/fp8_dispatch.py picks (the FP8 GEMV at 1 row without a
# table entry); `--no-enable-gemv` would put it back on _scaled_mm.
# At most 8 JSON files land in OUT_DIR, all stages run (the bench PNGs are removed: a device call
# brings back 8 files).
# Needs e2e/gpu_env.sh's set-up (the carried .whl/) and PAGODA_COMMIT (the copy there has no .git).
# SMOKE=1: every Pagoda stage on the tiny model on the CPU (checks the script, no figures).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT_DIR}
shift || true
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(correctness w2 w1)
if [ "${VLLM:-0}" = 1 ] && [[ " ${STAGES[*]} " != *" vllm "* ]]; then STAGES+=(vllm); fi
PY=${PYTHON:-python3}
PAGODA=("$PY" -m pagoda.runtime.cli)
mkdir -p "$OUT"
# shellcheck disable=SC1091
[ "${SMOKE:-0}" = 1 ] || source e2e/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
FP8=(--quantization fp8)
KV8=(--kv-cache-dtype fp8)
W1_ARGS=(--warmup-tokens 16) W2_ARGS=(--model w1 --warmup-iters 2 --iters 5)
if [ "${SMOKE:-0}" = 1 ]; then
    W1_ARGS=(--model tiny --num-prompts 4 --output-len 8 --warmup-prompts 2 --warmup-tokens 2 --device cpu)
    W2_ARGS=(--model tiny --output-len 8 --warmup-iters 1 --iters 2 --device cpu)
fi
rc=0

newest() {  # newest result file for a prefix such as W1-pagoda-fp8-kvfp8 in OUT_DIR (an exact tag: the
    # stamp follows it, so W1-pagoda never matches W1-pagoda-fp8-...)
    ls -t "$OUT"/"$1"-2*.json 2>/dev/null | head -n 1
}

stage_correctness() {
    local smoke=()
    [ "${SMOKE:-0}" = 1 ] && smoke=(--smoke)
    timeout 300 "$PY" e2e/gpu_fp8.py "${smoke[@]}" --out "$OUT/gpu-fp8-correctness-${PAGODA_COMMIT:-local}.json"
}

stage_gemv() {
    local smoke=()
    [ "${SMOKE:-0}" = 1 ] && smoke=(--smoke)
    timeout 540 "$PY" e2e/gemv_fp8_gpu_bench.py "${smoke[@]}" --out "$OUT"
}

stage_w2() {
    timeout 150 "${PAGODA[@]}" bench latency --backend pagoda "${W2_ARGS[@]}" --out "$OUT" || return 1
    timeout 150 "${PAGODA[@]}" bench latency --backend pagoda "${W2_ARGS[@]}" "${FP8[@]}" \
        --peer-result "$(newest W2-pagoda)" --out "$OUT"
}

stage_w1() {
    timeout 200 "${PAGODA[@]}" bench throughput --workload W1 --backend pagoda "${W1_ARGS[@]}" --out "$OUT" || return 1
    timeout 200 "${PAGODA[@]}" bench throughput --workload W1 --backend pagoda "${W1_ARGS[@]}" "${FP8[@]}" "${KV8[@]}" \
        --peer-result "$(newest W1-pagoda)" --out "$OUT"
}

stage_vllm() {
    if [ ! -d /tmp/vsite/vllm ]; then
        local installer=.vllm/install-on-gpu  # or beside the small parts (e2e/vllm_small_parts.sh)
        [ -f .vllm/small/install-on-gpu ] && installer=.vllm/small/install-on-gpu
        bash "$installer" "${VLLM_PARTS:-/tmp/vp}" || return 1
    fi
    local vllm_env=(env PYTHONPATH=/tmp/vsite:/tmp/pagoda-src HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1)
    local w2 w1 peer2=() peer1=()
    w2=$(newest W2-pagoda-fp8) && [ -n "$w2" ] && peer2=(--peer-result "$w2")
    w1=$(newest W1-pagoda-fp8-kvfp8) && [ -n "$w1" ] && peer1=(--peer-result "$w1")
    if [ "${VLLM_W2:-1}" = 1 ]; then
        "${vllm_env[@]}" timeout 240 python3 -m pagoda.runtime.cli bench latency --backend vllm "${W2_ARGS[@]}" \
            "${FP8[@]}" "${peer2[@]}" --out "$OUT" || rc=1
    fi
    "${vllm_env[@]}" timeout 300 python3 -m pagoda.runtime.cli bench throughput --workload W1 --backend vllm \
        "${W1_ARGS[@]}" "${FP8[@]}" "${KV8[@]}" "${peer1[@]}" --out "$OUT" || rc=1
}

for stage in "${STAGES[@]}"; do
    echo "=== $stage ($(date -u +%H:%M:%S))"
    "stage_$stage" || { echo "stage $stage failed" >&2; rc=1; }
done
# The device call brings back at most 8 files: keep the JSON, drop the bench plots unless KEEP_PNG=1.
[ "${KEEP_PNG:-0}" = 1 ] || rm -f "$OUT"/*.png
ls -1 "$OUT"
exit $rc
