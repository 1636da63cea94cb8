#!/usr/bin/env bash
# W3 against Pagoda and vLLM 0.26 on one H200, the same load generator and prompt token ids,
# in one device call per server (a full 512-request sweep takes about 5 minutes per server):
#
#   bash e2e/run_w3_peer.sh OUT_DIR SERVER [RATE...]     SERVER: pagoda or vllm; RATEs default
#                                                         "4 8 16 32 inf" (BENCHMARKS.md's W3)
#   python3 e2e/w3_compare.py OUT_DIR                      one table and one plot of both
#
# vllm needs vLLM installed in /tmp/vsite (../shared/tools/vllm-peer; .vllm/install-on-gpu), and
# serves with its defaults except the shared ones: dummy weights, 2k context, the served name.
# Env: W3_NUM_PROMPTS (512), W3_REPEAT (1: runs of the sweep, each its own JSON, run r with seed
# W3_SEED + r - 1, so a repeat does not find its prompts in the prefix cache), W3_SEED (0), PORT (8321),
# SERVE_ARGS (extra server flags), PAGODA_COMMIT (recorded; the copy there has no .git),
# SERVER_LOG (keep the server's log there), LOG_LEVEL (pagoda's, default warning).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT_DIR}
SERVER=${2:?pagoda or vllm}
shift 2
RATES=("$@")
[ ${#RATES[@]} -eq 0 ] && RATES=(4 8 16 32 inf)
PORT=${PORT:-8321}
mkdir -p "$OUT"
# shellcheck disable=SC1091
source e2e/gpu_env.sh
PY=${PYTHON:-python3}
model=$("$PY" -m pagoda.runtime.cli bench model w1 | tail -n 1)
log=${SERVER_LOG:-$(mktemp -t w3-server.XXXXXX.log)}
common=(--host 127.0.0.1 --port "$PORT" --load-format dummy --max-model-len 2048 --served-model-name w1)
if [ "$SERVER" = vllm ]; then
    [ -d /tmp/vsite/vllm ] || bash .vllm/install-on-gpu "${VLLM_PARTS:-/tmp/vp}" || exit 1
    # shellcheck disable=SC2086
    env PYTHONPATH=/tmp/vsite HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
        python3 -m vllm.entrypoints.cli.main serve "$model" "${common[@]}" ${SERVE_ARGS:-} >"$log" 2>&1 &
else
    # shellcheck disable=SC2086
    "$PY" -m pagoda.runtime.cli serve "$model" "${common[@]}" --log-level "${LOG_LEVEL:-warning}" ${SERVE_ARGS:-} >"$log" 2>&1 &
fi
server_pid=$!
rc=0
for run in $(seq 1 "${W3_REPEAT:-1}"); do
    echo "=== $SERVER W3 run $run ($(date -u +%H:%M:%S))"
    "$PY" -m pagoda.runtime.cli bench serve --base-url "http://127.0.0.1:$PORT" --model w1 \
        --wait-for-server 900 --prompt-format ids --request-rate "${RATES[@]}" \
        --num-prompts "${W3_NUM_PROMPTS:-512}" --seed $((${W3_SEED:-0} + run - 1)) \
        --backend-name "$SERVER" --no-progress --out "$OUT" || rc=$?
done
# Kernel builds after start-up (runtime/worker/compile_watch.py) are the stalls issue 17 names.
grep -c "after start-up" "$log" | sed 's/^/compile warnings in the server log: /'
grep "after start-up" "$log" | head -n 5
kill "$server_pid" 2>/dev/null || true
wait "$server_pid" 2>/dev/null || true
[ "$rc" -ne 0 ] && tail -n 40 "$log" >&2
[ -z "${SERVER_LOG:-}" ] && rm -f "$log"
exit "$rc"
