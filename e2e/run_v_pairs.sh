#!/usr/bin/env bash
# FP8-cache decode with V read as 16-bit pairs (kernels/paged_attention_decode.py V_PAIRS) against V
# read a byte at a time, in one device call:
#   PAGODA_COMMIT=<sha> bash e2e/run_v_pairs.sh OUT_DIR [stage ...]
# stages (default all, in this order):
#   ceilings  e2e/gpu_ceilings.py: this card's matmul and copy ceilings (runtime/tools/bench/ceilings.py's table)
#   sweep     e2e/decode_fp8_sweep.py --quick (or $SWEEP_ARGS, say --shapes-only): both V reads per shape
#             (their difference recorded), then the tile sweep
#   w1        W1 with FP8 weights and FP8 KV: V bytes, V pairs (the engine's default), V pairs with the
#             sweep's best FP8 tile where it differs from FAT_TILE; then W1 bf16
#   correct   e2e/gpu_fp8.py: FP8 and FP8+KV8 logits against transformers on the 8B shape
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT_DIR}; shift
STAGES=("$@"); [ ${#STAGES[@]} -gt 0 ] || STAGES=(ceilings sweep w1 correct)
mkdir -p "$OUT"
# shellcheck disable=SC1091
source e2e/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
W1=(bench throughput --workload W1 --backend pagoda --warmup-tokens 16 --measure-ceilings --out "$OUT")
FP8=(--quantization fp8 --kv-cache-dtype fp8)
# The engine runs in this process (LLM), so a module switch set first reaches it.
with_decode() {  # with_decode 'd.V_PAIRS = False' bench ...
    local setting=$1; shift
    python3 -c "import sys; import pagoda.kernels.paged_attention_decode as d; $setting
from pagoda.runtime.cli import main; sys.exit(main(sys.argv[1:]))" "$@"
}
newest() { ls -t "$OUT"/"$1"-2*.json 2>/dev/null | head -n 1; }
rc=0
stage_ceilings() { timeout 120 python3 e2e/gpu_ceilings.py --out "$OUT"; }
stage_w1() {
    with_decode 'd.V_PAIRS = False' "${W1[@]}" "${FP8[@]}" || return 1
    local before tile; before=$(newest W1-pagoda-fp8-kvfp8); mv "$before" "${before%.json}-vbytes.json"
    before=${before%.json}-vbytes.json
    python3 -m pagoda.runtime.cli "${W1[@]}" "${FP8[@]}" --peer-result "$before" || return 1
    tile=$(python3 -c "import glob, json; r = json.load(open(sorted(glob.glob('$OUT/decode-fp8-sweep-*.json'))[-1]))
b = r['sweep'][0]; print(b['block_n'], b['num_warps'], b['num_stages'])" 2>/dev/null)  # none: no sweep
    if [ -n "$tile" ] && [ "$tile" != "64 2 3" ]; then
        echo "the sweep's best FP8 tile: $tile"
        with_decode "d.FAT_TILE = tuple(int(v) for v in '$tile'.split())" "${W1[@]}" "${FP8[@]}" --peer-result "$before"
        local tuned; tuned=$(newest W1-pagoda-fp8-kvfp8); mv "$tuned" "${tuned%.json}-tile-${tile// /-}.json"
    fi
    python3 -m pagoda.runtime.cli "${W1[@]}"
}
stage_sweep() { timeout 200 python3 e2e/decode_fp8_sweep.py ${SWEEP_ARGS:---quick} --out "$OUT"; }
stage_correct() { timeout 240 python3 e2e/gpu_fp8.py --out "$OUT/gpu-fp8-correctness-${PAGODA_COMMIT:-local}.json"; }
for stage in "${STAGES[@]}"; do
    echo "=== $stage ($(date -u +%H:%M:%S))"
    "stage_$stage" || { echo "stage $stage failed" >&2; rc=1; }
done
rm -f "$OUT"/*.png
ls -1 "$OUT"
exit $rc
