#!/usr/bin/env bash
# Issue 16 on one H200 in one device call: W4's GPU-busy share from the profiler (the 1,024-prompt
# run and the 256-prompt re-run), the per-step profile at 256 and 1,024 seats with a cProfile of
# the host, then W1 twice and W2 once (the "no worse than d692bc1" figures), then optional extra
# stages given as arguments (`fp8gemv`: e2e/run_fp8.sh's gemv stage, the FP8 small-M table).
#
#   bash e2e/run_w4_busy.sh OUT_DIR [fp8gemv]
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
stage() {  # NAME CMD...: run, log, re-pack
    local name=$1; shift
    echo "=== $name ($(date -u +%H:%M:%S))"
    "$@" > "$RES/$name.log" 2>&1 || echo "stage $name failed: rc=$?" | tee -a "$RES/$name.log"
    tail -n 5 "$RES/$name.log"
    pack
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$RES/gpu.txt" 2>&1
stage w4-busy1024 timeout 150 "${PAGODA[@]}" bench throughput --workload W4 --backend pagoda --gpu-busy 1024 --out "$RES"
stage w4-busy256 timeout 120 "${PAGODA[@]}" bench throughput --workload W4 --backend pagoda --gpu-busy 256 --out "$RES"
stage profile timeout 240 "$PY" e2e/profile_w4.py --out "$RES" --seats 256 1024 --cprofile 256
stage w1a timeout 150 "${PAGODA[@]}" bench throughput --workload W1 --backend pagoda --out "$RES"
stage w1b timeout 150 "${PAGODA[@]}" bench throughput --workload W1 --backend pagoda --out "$RES"
stage w2 timeout 120 "${PAGODA[@]}" bench latency --backend pagoda --model w1 --out "$RES"
for extra in "$@"; do
    case $extra in
        fp8gemv) stage fp8gemv bash e2e/run_fp8.sh "$RES/fp8" gemv ;;
        *) echo "unknown stage $extra" >&2 ;;
    esac
done
rm -f "$RES"/*.png
pack
ls -la "$RES"
