#!/usr/bin/env bash
# W4 through `pagoda bench` with LLM.generate's request feed (frontend/request_feed.py) and with
# every request added before the first step (LEAD_STEPS raised past any batch), alternating:
#   PAGODA_COMMIT=<sha> bash e2e/w4_feed_ab.sh OUT_DIR [pairs=2]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT_DIR}; PAIRS=${2:-2}
mkdir -p "$OUT"
# shellcheck disable=SC1091
source e2e/gpu_env.sh
run() {  # $1: feed (request_feed's own LEAD_STEPS) | upfront
    local lead=""; [ "$1" = upfront ] && lead=1000000
    echo "--- W4, requests $1"
    timeout 150 python3 - "$OUT" "$lead" <<'PY' 2>&1 | grep -E "^W4|rror"
import sys
from pagoda.runtime.frontend import request_feed
from pagoda.runtime.cli import main
if sys.argv[2]:
    request_feed.LEAD_STEPS = int(sys.argv[2])
sys.exit(main(["bench", "throughput", "--workload", "W4", "--backend", "pagoda", "--out", sys.argv[1]]))
PY
}
for _ in $(seq "$PAIRS"); do run upfront; run feed; done
rm -f "$OUT"/*.png
