#!/usr/bin/env bash
# Issue 16 on one H200 in one device call: W4's GPU-busy share from the profiler (all 1,024
# prompts, at 1,024 and 256 seats), the per-step profile at both with wall-clock stage timers, then
# the stages given as arguments, in their order: w1, w2 (the "no worse than d692bc1" figures),
# w1old (W1 at the commit packed in .cache/ab-COMMIT.tgz, for an A/B in the same call), w2fp8
# (W2 with --quantization fp8), w1fp8 (W1 with FP8 weights and KV, the last W1 as its peer), fp8gemv (e2e/run_fp8.sh's gemv stage, the FP8 small-M table).
#
#   bash e2e/run_w4_busy.sh OUT_DIR [w1|w1old|w2|w2fp8|w1fp8|fp8gemv]...
#
# After every stage OUT_DIR/all.tgz is re-packed, so a call cut off by its time limit still
# brings back what finished (a device call returns at most 8 files).
# Needs e2e/gpu_env.sh's set-up (the carried .whl/) and PAGODA_COMMIT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT_DIR}
shift || true
PY=${PYTHON:-python3}
PAGODA=("$PY" -m pagoda.runtime.cli)
RES="$OUT/res"
mkdir -p "$RES"
# shellcheck disable=SC1091
source e2e/gpu_env.sh
pack() { tar -C "$OUT" -czf "$OUT/all.tgz.tmp" res && mv "$OUT/all.tgz.tmp" "$OUT/all.tgz"; }
n=0
stage() {  # NAME CMD...: run, log (numbered: a stage may run twice), re-pack
    local name=$1 log; shift
    n=$((n + 1)); log="$RES/$(printf %02d $n)-$name.log"
    echo "=== $name ($(date -u +%H:%M:%S))"
    "$@" > "$log" 2>&1 || echo "stage $name failed: rc=$?" | tee -a "$log"
    tail -n 3 "$log"
    pack
}
w1_at_old() {  # OUT: W1 at an older commit packed as .cache/ab-COMMIT.tgz (git archive of runtime,
    # kernels, operator), in its own import root: an A/B of W1 inside one call
    local tgz
    tgz=$(ls .cache/ab-*.tgz | head -n 1)
    mkdir -p /tmp/old /tmp/old-src/pagoda "$1" && tar xzf "$tgz" -C /tmp/old
    for part in runtime kernels operator; do ln -sfn "/tmp/old/$part" "/tmp/old-src/pagoda/$part"; done
    PYTHONPATH=/tmp/old-src:/tmp/site timeout 150 "$PY" -m pagoda.runtime.cli bench throughput --workload W1 \
        --backend pagoda --out "$1"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$RES/gpu.txt" 2>&1
# W4 with the bench's default seats (one per request: 1,024), then with 256 (the earlier runs').
stage w4-busy timeout 150 "${PAGODA[@]}" bench throughput --workload W4 --backend pagoda --gpu-busy 1024 --out "$RES"
stage w4-busy-256 timeout 150 "${PAGODA[@]}" bench throughput --workload W4 --backend pagoda --gpu-busy 1024 \
    --max-num-seqs 256 --out "$RES"
stage profile timeout 240 "$PY" e2e/profile_w4.py --out "$RES" --seats 1024 256 --stages 1024
for extra in "$@"; do
    case $extra in
        w1) stage w1 timeout 150 "${PAGODA[@]}" bench throughput --workload W1 --backend pagoda --out "$RES" ;;
        w1old) stage w1old w1_at_old "$RES/old" ;;
        w2) stage w2 timeout 120 "${PAGODA[@]}" bench latency --backend pagoda --model w1 --out "$RES" ;;
        w2fp8) stage w2fp8 timeout 150 "${PAGODA[@]}" bench latency --backend pagoda --model w1 --quantization fp8 \
                   --out "$RES/fp8" ;;
        w1fp8) stage w1fp8 timeout 200 "${PAGODA[@]}" bench throughput --workload W1 --backend pagoda \
                   --quantization fp8 --kv-cache-dtype fp8 --peer-result "$(ls -t "$RES"/W1-pagoda-2*.json | head -n 1)" \
                   --out "$RES/fp8" ;;
        fp8gemv) stage fp8gemv bash e2e/run_fp8.sh "$RES/fp8" gemv ;;
        *) echo "unknown stage $extra" >&2 ;;
    esac
done
rm -f "$RES"/*.png
pack
ls -la "$RES"
