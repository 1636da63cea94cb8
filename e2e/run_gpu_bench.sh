#!/usr/bin/env bash
# The benchmarks of BENCHMARKS.md on one GPU, writing JSON + PNG per workload and backend.
#
#   e2e/run_gpu_bench.sh [OUT_DIR] [STAGE...]
#
# OUT_DIR defaults to e2e/results. STAGEs (default: w1 w2 w3) run in the order given:
#   w1  W1 offline throughput: the HF peer (static batching, batch 64), then Pagoda with the ratio
#   w2  W2 single-stream TPOT: the HF peer (static cache, compiled), then Pagoda with the speedup
#   w3  W3 serving: `pagoda serve` on the W1 model plus the load generator over loopback, with the
#       served/offline ratio against $W1_RESULT, else the newest W1-pagoda JSON in OUT_DIR, else
#       in e2e/results
#   w4  W4 offline throughput on the 0.5B model, plus the GPU-busy share from the profiler
#   w1json  W1 with a JSON schema on every request (e2e/w1_json_schema.json, structured outputs), and
#       the same W1 without it, both on w1-bpe (the W1 model with a byte-level BPE tokenizer that can
#       spell JSON): W1-bpe-pagoda and W1-json-pagoda, whose ratio_to_plain is the cost of the masks
# Each stage fits in a 10-minute command on an H200, so stages can also run one call at a time.
#
# Environment: PYTHON (default: python), HF_NUM_PROMPTS (W1 peer request count, default 128: the peer
# runs at ~650 tok/s, and its JSON records "capped": true when below the workload's 256),
# W3_RATES (default "4 8 16 32 inf"), W3_NUM_PROMPTS (default 512), PORT (default 8321),
# SERVE_ARGS (extra `pagoda serve` flags for W3, e.g. "--max-num-batched-tokens 16384"),
# CPU_SAMPLE=1 (W3 also writes W3-cpu-*.json: CPU use per process and thread, from e2e/cpu_sampler.py),
# PAGODA_COMMIT (the commit to record where the tree has no .git), and SMOKE=1: every stage on the
# tiny synthetic model with a few short requests, on the CPU too, to check this script end to end
# before spending GPU time (its figures mean nothing).
set -euo pipefail

cd "$(dirname "$0")/.."
OUT=${1:-e2e/results}
shift || true
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(w1 w2 w3)
PY=${PYTHON:-python}
PAGODA=("$PY" -m pagoda.runtime.cli)
HF_NUM_PROMPTS=${HF_NUM_PROMPTS:-128}
W3_RATES=${W3_RATES:-4 8 16 32 inf}
W3_NUM_PROMPTS=${W3_NUM_PROMPTS:-512}
PORT=${PORT:-8321}
mkdir -p "$OUT"

W1_ARGS=() HF_ARGS=(--hf-batch-size 64 --num-prompts "$HF_NUM_PROMPTS") W2_ARGS=() W3_ARGS=() W4_ARGS=(--gpu-busy 256)
W3_MODEL=w1
W1JSON_MODEL=w1-bpe
if [ "${SMOKE:-0}" = 1 ]; then
    W1_ARGS=(--model tiny --num-prompts 4 --output-len 8 --warmup-prompts 2 --warmup-tokens 2)
    HF_ARGS=("${W1_ARGS[@]}" --hf-batch-size 2)
    W2_ARGS=(--model tiny --output-len 8 --warmup-iters 1 --iters 2)
    W3_ARGS=(--input-len 16:32 --output-len 4:8)
    W3_RATES="4 inf" W3_NUM_PROMPTS=4 W3_MODEL=tiny W1JSON_MODEL=tiny-bpe
    W4_ARGS=("${W1_ARGS[@]}")
fi

newest() {  # newest result file for a prefix such as W1-pagoda, in OUT_DIR, else e2e/results
    ls -t "$OUT"/"$1"-*.json 2>/dev/null | head -n 1 | grep . || ls -t e2e/results/"$1"-*.json 2>/dev/null | head -n 1
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'

stage_w1() {
    "${PAGODA[@]}" bench throughput --workload W1 --backend hf "${HF_ARGS[@]}" --out "$OUT"
    "${PAGODA[@]}" bench throughput --workload W1 --backend pagoda "${W1_ARGS[@]}" \
        --peer-result "$(newest W1-hf)" --out "$OUT"
}

stage_w2() {
    "${PAGODA[@]}" bench latency --backend hf --hf-cache static "${W2_ARGS[@]}" --out "$OUT"
    "${PAGODA[@]}" bench latency --backend pagoda "${W2_ARGS[@]}" --peer-result "$(newest W2-hf)" --out "$OUT"
}

stage_w3() {
    local model log offline w1 server_pid sampler_pid="" rc=0
    model=$("${PAGODA[@]}" bench model "$W3_MODEL" | tail -n 1)
    log=$(mktemp -t pagoda-w3-server.XXXXXX.log)
    if [ "${CPU_SAMPLE:-0}" = 1 ]; then
        "$PY" e2e/cpu_sampler.py "$OUT/W3-cpu-$(date +%Y%m%d-%H%M%S).json" &
        sampler_pid=$!
    fi
    "${PAGODA[@]}" serve "$model" --host 127.0.0.1 --port "$PORT" --load-format dummy \
        --max-model-len 2048 --served-model-name "$W3_MODEL" --log-level warning ${SERVE_ARGS:-} >"$log" 2>&1 &
    server_pid=$!
    offline=()
    w1=${W1_RESULT:-$(newest W1-pagoda || true)}
    if [ -n "$w1" ]; then offline=(--offline-result "$w1"); else echo "no W1-pagoda result: no ratio" >&2; fi
    # shellcheck disable=SC2086
    "${PAGODA[@]}" bench serve --base-url "http://127.0.0.1:$PORT" --model "$W3_MODEL" --wait-for-server 600 \
        --request-rate $W3_RATES --num-prompts "$W3_NUM_PROMPTS" "${W3_ARGS[@]}" "${offline[@]}" \
        --no-progress --out "$OUT" || rc=$?
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    if [ -n "$sampler_pid" ]; then kill -TERM "$sampler_pid"; wait "$sampler_pid" || true; fi
    if [ "$rc" -ne 0 ]; then
        echo "W3 failed (rc=$rc); server log tail:" >&2
        tail -n 50 "$log" >&2
    fi
    rm -f "$log"
    return "$rc"
}

stage_w1json() {
    # --model after W1_ARGS, which name the plain model under SMOKE=1.
    "${PAGODA[@]}" bench throughput --workload W1 --backend pagoda "${W1_ARGS[@]}" --model "$W1JSON_MODEL" \
        --label W1-bpe --out "$OUT"
    "${PAGODA[@]}" bench throughput --workload W1 --backend pagoda "${W1_ARGS[@]}" --model "$W1JSON_MODEL" \
        --json-schema e2e/w1_json_schema.json --plain-result "$(newest W1-bpe-pagoda)" --out "$OUT"
}

stage_w4() {
    "${PAGODA[@]}" bench throughput --workload W4 --backend pagoda "${W4_ARGS[@]}" --out "$OUT"
}

for stage in "${STAGES[@]}"; do
    echo "=== $stage ==="
    "stage_$stage"
done
echo "results in $OUT:"
ls -1 "$OUT"
