#!/usr/bin/env bash
# W1 and W2 several times at one commit, each run in a fresh process, to see their spread, and the
# A/B runs that decide a default, in the same call.
#
#   e2e/repeat_w1_w2.sh OUT_DIR [REPEATS]
#
# Runs REPEATS (default 3) W1 and W2 with the defaults, then W1 with a 32k token budget and W2 with
# rotary and the KV write as two kernels (--no-fused-rope-kv). The ratios to the transformers
# peer use the peer results committed in e2e/results (W1_PEER, W2_PEER), measured on the same GPU
# type. Then summary.json: every figure, with the median of the default runs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT_DIR}
REPEATS=${2:-3}
PY=${PYTHON:-python3}
W1_PEER=${W1_PEER:-e2e/results/W1-hf-20261129-111612.json}
W2_PEER=${W2_PEER:-e2e/results/W2-hf-20261129-094634.json}
COMMON=(--load-format dummy --dtype auto --device auto --output-len 256 --seed 0 --max-model-len 2048
        --gpu-memory-utilization 0.9)
mkdir -p "$OUT/default" "$OUT/ab"

w1() {  # OUT_DIR [extra flags]
    local dir=$1; shift
    timeout 150 "$PY" -m pagoda.runtime.cli bench throughput --workload W1 --backend pagoda "${COMMON[@]}" \
        --warmup-tokens 16 --max-num-seqs 256 --hf-batch-size 64 --gpu-busy 0 --peer-result "$W1_PEER" \
        --out "$dir" "$@" >> "$OUT/w1.log" 2>&1 || echo "W1 run failed: $*" | tee -a "$OUT/w1.log"
}
w2() {
    local dir=$1; shift
    timeout 120 "$PY" -m pagoda.runtime.cli bench latency --backend pagoda --model w1 "${COMMON[@]}" \
        --warmup-iters 2 --iters 5 --hf-cache static --peer-result "$W2_PEER" \
        --out "$dir" "$@" >> "$OUT/w2.log" 2>&1 || echo "W2 run failed: $*" | tee -a "$OUT/w2.log"
}

for _ in $(seq "$REPEATS"); do w1 "$OUT/default"; w2 "$OUT/default"; done
w1 "$OUT/ab" --max-num-batched-tokens 32768
w2 "$OUT/ab" --no-fused-rope-kv

"$PY" - "$OUT" <<'PY'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
def figures(folder, workload, key):
    return [json.loads(p.read_text())[key] for p in sorted((out / folder).glob(f"{workload}-pagoda-*.json"))]
summary = {
    "w1_tok_per_s": figures("default", "W1", "output_tokens_per_s"),
    "w2_tpot_ms_p50": figures("default", "W2", "tpot_ms_p50"),
    "w1_tok_per_s_budget_32k": figures("ab", "W1", "output_tokens_per_s"),
    "w2_tpot_ms_p50_unfused_rope_kv": figures("ab", "W2", "tpot_ms_p50"),
}
summary["w1_median"] = statistics.median(summary["w1_tok_per_s"] or [0])
summary["w2_median"] = statistics.median(summary["w2_tpot_ms_p50"] or [0])
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
PY
