#!/usr/bin/env bash
# W3 against Pagoda and vLLM 0.26 in ONE device call: both servers resident on the one H200 at once
# (each given the same share of its memory), then, rate by rate, the same load generator and prompt
# token ids against each in turn, so the ratio at every rate comes from the same call and machine.
#
#   bash e2e/run_w3_same_call.sh OUT_DIR [RATE...]       RATEs default "4 8 16 32 inf"
#   python3 e2e/w3_compare.py OUT_DIR                    one table and one plot of both
#
# Why both resident: a call is limited to 10 minutes, vLLM's start takes 1.5-4 minutes, and the full
# sweep takes about 5 minutes per server, so starting each server once and alternating the runs is
# what lets rates share a call. An idle server launches no kernels, so the other one has the GPU to
# itself while it is measured. MEM (default 0.44) is each server's --gpu-memory-utilization: both
# get the same KV budget, which bounds only the all-at-once rate (the finite rates use a fraction).
# The order alternates per rate (vLLM first at the first rate) so neither always runs second.
# Env: W3_NUM_PROMPTS (512), W3_SEED (0), RATE_INDEX0 (0: the first rate's index in the sweep, for
# its prompts' seed when a sweep is split over calls), MEM, PAGODA_PORT (8321), VLLM_PORT (8322), SERVE_ARGS
# (Pagoda's extra flags), VLLM_ARGS, PAGODA_COMMIT (recorded), VLLM_PARTS (/tmp/vp), PACK (a .tgz path).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT_DIR}
shift
RATES=("$@")
[ ${#RATES[@]} -eq 0 ] && RATES=(4 8 16 32 inf)
MEM=${MEM:-0.44}
PP=${PAGODA_PORT:-8321}
VP=${VLLM_PORT:-8322}
mkdir -p "$OUT"
# shellcheck disable=SC1091
source e2e/gpu_env.sh
PY=${PYTHON:-python3}
installer=.vllm/install-on-gpu  # or beside the small parts (e2e/vllm_small_parts.sh)
[ -f .vllm/small/install-on-gpu ] && installer=.vllm/small/install-on-gpu
[ -d /tmp/vsite/vllm ] || bash "$installer" "${VLLM_PARTS:-/tmp/vp}" || exit 1
# PACK=FILE: re-pack OUT_DIR into FILE after every run, so a call cut off by its limit still brings
# back the rates that finished (and one file instead of the device's eight-file limit). FILE must
# lie outside OUT_DIR.
pack() { [ -n "${PACK:-}" ] || return 0; tar -C "$OUT" -czf "$PACK.tmp" . && mv "$PACK.tmp" "$PACK"; }
model=$("$PY" -m pagoda.runtime.cli bench model w1 | tail -n 1)
common=(--host 127.0.0.1 --load-format dummy --max-model-len 2048 --served-model-name w1 --gpu-memory-utilization "$MEM")
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/gpu-before.csv"

ready() {  # ready PORT SECONDS PID: wait until /health answers 200 (or the server exits)
    "$PY" - "$@" <<'PYEOF'
import os, sys, time, urllib.request
port, limit, pid = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
start = time.monotonic()
while time.monotonic() - start < limit:
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status == 200:
            print(f"port {port} ready after {time.monotonic() - start:.0f} s")
            sys.exit(0)
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(f"server on port {port} exited after {time.monotonic() - start:.0f} s")
    time.sleep(2)
sys.exit(f"server on port {port} not ready after {limit:.0f} s")
PYEOF
}
# Pagoda first: it sizes its KV pool as MEM x total minus its own use, and vLLM checks at start that
# MEM x total is still free, so the second server must start after the first has taken its share.
echo "=== pagoda start $(date -u +%H:%M:%S)"
# shellcheck disable=SC2086
"$PY" -m pagoda.runtime.cli serve "$model" "${common[@]}" --port "$PP" --log-level warning ${SERVE_ARGS:-} \
    >"$OUT/pagoda-server.log" 2>&1 &
ppid=$!
ready "$PP" 300 "$ppid" || { echo "pagoda did not start"; tail -n 40 "$OUT/pagoda-server.log"; kill $ppid; exit 1; }
echo "=== vllm start $(date -u +%H:%M:%S)"
# shellcheck disable=SC2086
env PYTHONPATH=/tmp/vsite HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
    python3 -m vllm.entrypoints.cli.main serve "$model" "${common[@]}" --port "$VP" ${VLLM_ARGS:-} \
    >"$OUT/vllm-server.log" 2>&1 &
vpid=$!
ready "$VP" 600 "$vpid" || { echo "vllm did not start"; tail -n 40 "$OUT/vllm-server.log"; kill $ppid $vpid; exit 1; }
echo "=== both up $(date -u +%H:%M:%S)"
nvidia-smi --query-gpu=memory.used --format=csv | tee "$OUT/gpu-both.csv"

run() {  # run SERVER PORT RATE SEED
    echo "=== $1 W3 at $3 req/s ($(date -u +%H:%M:%S))"
    "$PY" -m pagoda.runtime.cli bench serve --base-url "http://127.0.0.1:$2" --model w1 --prompt-format ids \
        --request-rate "$3" --num-prompts "${W3_NUM_PROMPTS:-512}" --seed "$4" \
        --backend-name "$1" --no-progress --out "$OUT" || rc=$?
    pack
}
rc=0
i=0
for rate in "${RATES[@]}"; do
    # fresh prompts per rate, as one sweep draws them (serve.py's RATE_SEED_STRIDE): each server's
    # prefix cache still holds the earlier rates' prompts
    seed=$((${W3_SEED:-0} + ${RATE_INDEX0:-0} * 7919 + i * 7919))
    if [ $((i % 2)) -eq 0 ]; then run vllm "$VP" "$rate" "$seed"; run pagoda "$PP" "$rate" "$seed"
    else run pagoda "$PP" "$rate" "$seed"; run vllm "$VP" "$rate" "$seed"; fi
    i=$((i + 1))
done
grep -c "after start-up" "$OUT/pagoda-server.log" | sed 's/^/pagoda compile warnings after start-up: /'
kill "$ppid" "$vpid" 2>/dev/null || true
wait 2>/dev/null || true
pack
exit "$rc"
