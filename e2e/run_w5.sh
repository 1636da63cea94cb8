#!/usr/bin/env bash
# W5 of BENCHMARKS.md (W1's requests on the Qwen3-30B-A3B shape, random bf16 weights) on one H200:
# Pagoda, then vLLM 0.26 on the same prompt token ids in the same call; and the GPU correctness of
# the families of issue 18 against transformers.
#
#   bash e2e/run_w5.sh OUT_DIR [STAGE...]        STAGEs (default: pagoda vllm), in the order given:
#     correctness  e2e/gpu_correctness_families.py (Qwen3, Gemma 2 and Qwen3-MoE shapes), ~3 min
#     pagoda       `pagoda bench throughput --workload W5`, ~3 min
#     vllm         installs vLLM from /tmp/vparts (../shared/tools/vllm-peer/README.md: one device call
#                  per part first), then e2e/vllm_peer.py --workload W5, and the ratio to this
#                  call's Pagoda result, ~5 min on a machine where vLLM has not compiled yet
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

stage_pagoda() {
    timeout 360 "$PY" -m pagoda.runtime.cli bench throughput --workload W5 --out "$OUT"
}

stage_vllm() {
    local model pagoda_result
    model=$("$PY" -m pagoda.runtime.cli bench model w5 | tail -n 1)
    pagoda_result=$(ls -t "$OUT"/W5-pagoda-*.json 2>/dev/null | head -n 1)
    if [ ! -d /tmp/vsite/vllm ]; then
        rm -rf /tmp/vsite /tmp/vwheels && mkdir -p /tmp/vwheels
        cat /tmp/vparts/part-* | tar -C /tmp/vwheels -xf - || return 1
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/vsite \
            /tmp/vwheels/wheels/*.whl || return 1
    fi
    # vLLM's own FastAPI/pydantic: without Pagoda's /tmp/site; Pagoda's stdlib-only bench modules only.
    env PYTHONPATH=/tmp/vsite:/tmp/pagoda-src HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
        timeout 480 python3 e2e/vllm_peer.py --workload W5 --model-dir "$model" --out "$OUT" || return 1
    [ -z "$pagoda_result" ] && return 0
    python3 -c 'import json, sys
p, v = (json.load(open(f))["output_tokens_per_s"] for f in sys.argv[1:])
print(f"W5: pagoda {p:.0f} tok/s, vllm {v:.0f} tok/s, ratio {p / v:.3f}")' "$pagoda_result" "$OUT/W5-vllm-seatsdefault.json"
}

for stage in "${STAGES[@]}"; do
    echo "=== $stage ($(date -u +%H:%M:%S))"
    "stage_$stage" || { echo "stage $stage failed" >&2; rc=1; }
done
exit $rc
