#!/usr/bin/env bash
# Programmatic dependent launch (kernels/pdl.py, --enable-pdl) and the one-row decode folds
# (--fold-gemv, the fused attention merge) on one H200 in one device call:
#
#   bash e2e/run_pdl.sh OUT_DIR [STAGE...]      STAGEs (default: chain w2 correctness), in order
#     chain        e2e/decode_chain_gpu_bench.py: 32 decode layers at one row as one CUDA graph, PDL off and on
#                  (same bits both ways), FP8 and bf16, and the FP8 GEMV's 1-row launches swept with PDL on
#     w2           W2 (bench latency, 8B shape) bf16 and FP8, each with PDL off then on (the off run is the peer)
#     w2fp8        W2 FP8 only
#     w2fold       W2 FP8 with --no-fold-gemv, then with --fold-gemv against it
#     w2residual   W2 FP8 with --no-fold-residual, then with --fold-residual against it
#     w2tma        W2 FP8 with --no-gemv-tma, then with --gemv-tma against it
#     w2rope       W2 FP8 with --no-fold-rope-kv, then with --fold-rope-kv against it (kernels/gemv_rope.py)
#     w2ropebf16   the same with bf16 weights
#     w2bf16       W2 bf16 once, at the defaults
#     w2fp8once    W2 FP8 once, at the defaults
#     attention    e2e/decode_attention_w2_bench.py: W2's decode attention (one sequence) over splits and tiles
#     w1           W1 (bench throughput, bf16) with PDL off then on: batches above the GEMV's rows
#     w4           W4 (bench throughput, 1,024 seats) with PDL off then on
#     w4busy       W4 at the defaults with the profiler's GPU-busy figure (--gpu-busy 1024)
#     w1busy       W1 at the defaults with the profiler's GPU-busy figure (--gpu-busy 256)
#     ceilings     e2e/gpu_ceilings.py: this card's bf16 and FP8 matmul and copy ceilings, for its own roofline
#     fp8correct   e2e/gpu_fp8.py at the defaults: FP8 and FP8+FP8-KV logits against transformers
#     correctness  e2e/gpu_correctness.py --enable-pdl (8 layers of the 8B shape and the 0.5B shape against
#                  transformers, graphs against eager)
#     correctrope  the same with --fold-rope-kv
#
# ENGINE_ARGS go to every engine, CHAIN_ARGS (say "--no-sweep") to the chain bench. Needs e2e/gpu_env.sh's set-up (the carried .whl/) and PAGODA_COMMIT.
# OUT_DIR/all.tgz is re-packed after every stage, so a call cut off by its limit still brings back what finished.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT_DIR}
shift || true
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(chain w2 correctness)
RES="$OUT/res"
mkdir -p "$RES"
# shellcheck disable=SC1091
source e2e/gpu_env.sh
PY=${PYTHON:-python3}
pack() { tar -C "$OUT" -czf "$OUT/all.tgz.tmp" res && mv "$OUT/all.tgz.tmp" "$OUT/all.tgz"; }
stage() {  # NAME CMD...: run, log, re-pack
    local name=$1; shift
    echo "=== $name ($(date -u +%H:%M:%S))"
    "$@" > "$RES/$name.log" 2>&1 || echo "stage $name failed: rc=$?" | tee -a "$RES/$name.log"
    grep -E "chain|best|TPOT|ok|PASS|FAIL|same_bits" "$RES/$name.log" | grep -v Warning | tail -n 12
    pack
}
newest() { ls -t "$RES"/"$1"-2*.json 2>/dev/null | grep -v pdl-o | head -n 1; }
mark() {  # TAG on|off: name the newest TAG result after its PDL setting
    local f; f=$(newest "$1")
    [ -n "$f" ] && mv "$f" "${f%.json}-pdl-$2.json"
}
w2() {  # [--quantization fp8]: off, then on against it
    local tag=W2-pagoda${1:+-fp8}
    # shellcheck disable=SC2086
    timeout 150 "$PY" -m pagoda.runtime.cli bench latency --backend pagoda --model w1 --warmup-iters 2 --iters 5 \
        "$@" --no-enable-pdl ${ENGINE_ARGS:-} --out "$RES" || return 1
    mark "$tag" off
    # shellcheck disable=SC2086
    timeout 150 "$PY" -m pagoda.runtime.cli bench latency --backend pagoda --model w1 --warmup-iters 2 --iters 5 \
        "$@" --enable-pdl ${ENGINE_ARGS:-} --peer-result "$(ls -t "$RES/$tag"-2*-pdl-off.json | head -n 1)" \
        --out "$RES" || return 1
    mark "$tag" on
}
w2ab() {  # KNOB: W2 FP8 (W2AB_BF16=1: bf16) with --no-KNOB, then --KNOB against it (PDL on both times); files
    # end in -[no-]KNOB
    local tag=W2-pagoda-fp8 quant=(--quantization fp8) flag f
    [ "${W2AB_BF16:-0}" = 1 ] && tag=W2-pagoda quant=()
    for flag in "no-$1" "$1"; do
        # shellcheck disable=SC2086
        timeout 150 "$PY" -m pagoda.runtime.cli bench latency --backend pagoda --model w1 --warmup-iters 2 --iters 5 \
            "${quant[@]}" --"$flag" ${ENGINE_ARGS:-} \
            $([ "$flag" = "$1" ] && echo --peer-result "$(ls -t "$RES/$tag"-2*-no-"$1".json | head -n 1)") \
            --out "$RES" || return 1
        f=$(ls -t "$RES/$tag"-2*.json | grep -v -- "-$1.json" | head -n 1)
        mv "$f" "${f%.json}-$flag.json"
    done
}
w1() {  # WORKLOAD: off, then on
    local flag
    for flag in off on; do
        # shellcheck disable=SC2086
        timeout 200 "$PY" -m pagoda.runtime.cli bench throughput --workload "$1" --backend pagoda --warmup-tokens 16 \
            --"$([ $flag = on ] || echo no-)"enable-pdl ${ENGINE_ARGS:-} --out "$RES" || return 1
        mark "$1"-pagoda $flag
    done
}
for s in "${STAGES[@]}"; do
    case $s in
        chain) stage chain timeout 420 "$PY" e2e/decode_chain_gpu_bench.py ${CHAIN_ARGS:-} --out "$RES" ;;
        w2) stage w2-bf16 w2; stage w2-fp8 w2 --quantization fp8 ;;
        w2fp8) stage w2-fp8 w2 --quantization fp8 ;;
        w2fold) stage w2-fold w2ab fold-gemv ;;
        w2residual) stage w2-residual w2ab fold-residual ;;
        w2tma) stage w2-tma w2ab gemv-tma ;;
        w2rope) stage w2-rope w2ab fold-rope-kv ;;
        w2ropebf16) W2AB_BF16=1 stage w2-rope-bf16 w2ab fold-rope-kv ;;
        w2bf16) stage w2-bf16 timeout 150 "$PY" -m pagoda.runtime.cli bench latency --backend pagoda --model w1 \
            --warmup-iters 2 --iters 5 ${ENGINE_ARGS:-} --out "$RES" ;;
        w2fp8once) stage w2-fp8-once timeout 150 "$PY" -m pagoda.runtime.cli bench latency --backend pagoda --model w1 \
            --warmup-iters 2 --iters 5 --quantization fp8 ${ENGINE_ARGS:-} --out "$RES" ;;
        attention) stage attention timeout 200 "$PY" e2e/decode_attention_w2_bench.py --out "$RES" ;;
        w1) stage w1 w1 W1 ;;
        w4) stage w4 w1 W4 ;;
        w4busy) stage w4-busy timeout 300 "$PY" -m pagoda.runtime.cli bench throughput --workload W4 --backend pagoda \
            --gpu-busy 1024 ${ENGINE_ARGS:-} --out "$RES" ;;
        w1busy) stage w1-busy timeout 300 "$PY" -m pagoda.runtime.cli bench throughput --workload W1 --backend pagoda \
            --gpu-busy 256 ${ENGINE_ARGS:-} --out "$RES" ;;
        ceilings) stage ceilings timeout 120 "$PY" e2e/gpu_ceilings.py --out "$RES" ;;
        fp8correct) stage fp8-correctness timeout 300 "$PY" e2e/gpu_fp8.py \
            --out "$RES/gpu-fp8-correctness-${PAGODA_COMMIT:-local}.json" ;;
        correctness) stage correctness timeout 300 "$PY" e2e/gpu_correctness.py --enable-pdl --llama-layers 8 \
            --out "$RES/gpu-correctness-pdl-${PAGODA_COMMIT:-local}.json" ;;
        correctrope) stage correctness-rope timeout 300 "$PY" e2e/gpu_correctness.py --enable-pdl --fold-rope-kv \
            --llama-layers 8 --out "$RES/gpu-correctness-rope-${PAGODA_COMMIT:-local}.json" ;;
        *) echo "unknown stage $s"; exit 2 ;;
    esac
done
ls -la "$RES"
