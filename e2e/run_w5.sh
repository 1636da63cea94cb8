#!/usr/bin/env bash
# W5 of BENCHMARKS.md (W1's requests on the Qwen3-30B-A3B shape, random bf16 weights) on one H200:
# Pagoda, then vLLM 0.26 on the same prompt token ids in the same call; and the GPU correctness of
# the families of issue 18 against transformers.
#
#   bash e2e/run_w5.sh OUT_DIR [STAGE...]        STAGEs (default: pagoda vllm), in the order given:
#     sweep        e2e/moe_gpu_sweep.py: routing, grouping and tile times of one W5 MoE layer; merges the
#                  best tiles into kernels/moe_tiles.json (copied to OUT), which later stages use, ~3 min
#     correctness  e2e/gpu_correctness_families.py (Qwen3, Gemma 2 and Qwen3-MoE shapes), ~3 min
#     pagoda       `pagoda bench throughput --workload W5`, ~3 min
#     vllm         installs vLLM from $VLLM_PARTS (default /tmp/vp; ../shared/tools/vllm-peer/README.md:
#                  one device call per part of .vllm/ first), then `pagoda bench throughput --workload W5
#                  --backend vllm` with this call's Pagoda result as the peer (the JSON's
#                  ratio_to_peer is vLLM's to Pagoda's), ~5 min where vLLM has not compiled yet
#
# Needs e2e/gpu_env.sh's set-up (the carried .whl/) and PAGODA_COMMIT (the copy there has no .git).
# SMOKE=1 runs the correctness stage on tiny shapes on the CPU (checks this script, no figures).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-e2e/results}
shift || true
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(pagoda vllm)
PY=${PYTHON:-python3}
mkdir -p "$OUT"
# shellcheck disable=SC1091
source e2e/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
rc=0

stage_correctness() {
    local smoke=()
    [ "${SMOKE:-0}" = 1 ] && smoke=(--smoke)
    timeout 420 "$PY" e2e/gpu_correctness_families.py "${smoke[@]}" \
        --out "$OUT/gpu-correctness-families-${PAGODA_COMMIT:-local}.json"
}

stage_sweep() {
    timeout 300 "$PY" e2e/moe_gpu_sweep.py --out "$OUT" && cp kernels/moe_tiles.json "$OUT/"
}

stage_pagoda() {
    timeout 360 "$PY" -m pagoda.runtime.cli bench throughput --workload W5 --out "$OUT"
}

stage_vllm() {
    local pagoda_result peer=()
    pagoda_result=$(ls -t "$OUT"/W5-pagoda-*.json 2>/dev/null | head -n 1)
    [ -n "$pagoda_result" ] && peer=(--peer-result "$pagoda_result")
    if [ ! -d /tmp/vsite/vllm ]; then
        bash .vllm/install-on-gpu "${VLLM_PARTS:-/tmp/vp}" || return 1
    fi
    # vLLM's own FastAPI/pydantic: without Pagoda's /tmp/site (the bench modules need none of it).
    # The same bench command as Pagoda's stage, same seats; the ratio is vLLM's to this call's Pagoda.
    env PYTHONPATH=/tmp/vsite:/tmp/pagoda-src HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
        timeout 480 python3 -m pagoda.runtime.cli bench throughput --workload W5 --backend vllm \
        "${peer[@]}" --out "$OUT"
}

for stage in "${STAGES[@]}"; do
    echo "=== $stage ($(date -u +%H:%M:%S))"
    "stage_$stage" || { echo "stage $stage failed" >&2; rc=1; }
done
exit $rc
