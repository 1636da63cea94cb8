#!/usr/bin/env bash
# Mixed steps scheduled ahead (Scheduler._mixed_ahead), on one H200 in one device call: W4's GPU
# busy share (profiler, 1,024 prompts at 1,024 seats) with mixed steps ahead and without
# (--schedule-mixed-ahead, an A/B interleaved W4_ROUNDS times: one W4 run's spread is 5-20%), the
# gap trace both ways (admission phase; whole run), W1 both ways, W2, then W3 at 16 req/s against
# `pagoda serve`, twice each way.
#
#   bash e2e/run_mixed_ahead.sh OUT_DIR [STAGE...]     STAGEs (default: w4 gaps gaps-full w1 w2 w3; also w4on, w3on: on only;
#     syncs: one whole W4 run at the defaults with every synchronizing CUDA call counted by its call site,
#     w4_gap_trace.py --syncs), in order
#
# Needs e2e/gpu_env.sh's set-up (the carried .whl/) and PAGODA_COMMIT. A smoke run of the w3 stage on
# the CPU: PYTHON=.venv/bin/python W3_MODEL=<tiny folder> W3_NUM_PROMPTS=8 bash e2e/run_mixed_ahead.sh DIR w3. OUT_DIR/all.tgz is
# re-packed after every stage, so a call cut off by its limit still brings back what finished.
# ENGINE_ARGS (say "--max-mixed-graph-tokens 16384") go to every engine the script starts; LABEL
# names the result folders under OUT_DIR/res (default: none), so one call can run the script twice.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT_DIR}
shift || true
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(w4 gaps gaps-full w1 w2 w3)
RES="$OUT/res${LABEL:+/$LABEL}"
mkdir -p "$RES"
# shellcheck disable=SC1091
source e2e/gpu_env.sh
PY=${PYTHON:-python3}
pack() { tar -C "$OUT" -czf "$OUT/all.tgz.tmp" res && mv "$OUT/all.tgz.tmp" "$OUT/all.tgz"; }
stage() {  # NAME CMD...: run, log, re-pack
    local name=$1; shift
    echo "=== $name ($(date -u +%H:%M:%S))"
    "$@" > "$RES/$name.log" 2>&1 || echo "stage $name failed: rc=$?" | tee -a "$RES/$name.log"
    grep -E "tok/s|TPOT|busy|TTFT" "$RES/$name.log" | grep -v Warning | tail -n 4
    pack
}
ahead_flag() {  # on|off -> the engine flag
    if [ "$1" = on ]; then echo --schedule-mixed-ahead; else echo --no-schedule-mixed-ahead; fi
}
pagoda() {  # on|off ARGS...: the CLI, with --schedule-mixed-ahead or without
    local on=$1; shift
    # shellcheck disable=SC2086
    "$PY" -m pagoda.runtime.cli "$@" "$(ahead_flag "$on")" ${ENGINE_ARGS:-}
}
w3() {  # on|off: W3 at 16 req/s, twice, against one server
    local on=$1 model port=8321 pid rc=0 flag
    flag=$(ahead_flag "$on")
    model=${W3_MODEL:-$("$PY" -m pagoda.runtime.cli bench model w1 | tail -n 1)}  # W3_MODEL: a CPU smoke run
    "$PY" -m pagoda.runtime.cli serve "$model" --host 127.0.0.1 --port $port --load-format dummy \
        --max-model-len 2048 --served-model-name w1 --log-level warning $flag ${ENGINE_ARGS:-} > "$RES/w3-$on-server.log" 2>&1 &
    pid=$!
    for _ in $(seq 150); do
        "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=5)" 2>/dev/null && break
        kill -0 $pid 2>/dev/null || { echo "server exited"; return 1; }
        sleep 2
    done
    for seed in 0 7919; do
        "$PY" -m pagoda.runtime.cli bench serve --base-url "http://127.0.0.1:$port" --model w1 --prompt-format ids \
            --request-rate 16 --num-prompts "${W3_NUM_PROMPTS:-256}" --seed $seed --no-progress --out "$RES/w3-$on" || rc=$?
    done
    grep -c "after start-up" "$RES/w3-$on-server.log" | sed 's/^/compile warnings after start-up: /'
    kill $pid
    wait $pid 2>/dev/null
    return $rc
}
for s in "${STAGES[@]}"; do
    case $s in
        w4on) stage w4-on pagoda on bench throughput --workload W4 --backend pagoda --gpu-busy 1024 --out "$RES/on" ;;
        w4) for round in $(seq "${W4_ROUNDS:-3}"); do
                stage "w4-on-$round" pagoda on bench throughput --workload W4 --backend pagoda --gpu-busy 1024 --out "$RES/on"
                stage "w4-off-$round" pagoda off bench throughput --workload W4 --backend pagoda --gpu-busy 1024 --out "$RES/off"
            done ;;
        gaps) stage gaps-on "$PY" e2e/w4_gap_trace.py --out "$RES/gaps" --mixed-ahead on
              stage gaps-off "$PY" e2e/w4_gap_trace.py --out "$RES/gaps" --mixed-ahead off ;;
        gaps-full)  # the whole of W4 (256 output tokens): where over the run the idle time sits
            stage gaps-full-on "$PY" e2e/w4_gap_trace.py --out "$RES/gaps-full" --output-len 256 --traces plain --mixed-ahead on
            stage gaps-full-off "$PY" e2e/w4_gap_trace.py --out "$RES/gaps-full" --output-len 256 --traces plain --mixed-ahead off ;;
        syncs) stage syncs "$PY" e2e/w4_gap_trace.py --out "$RES/syncs" --output-len 256 --traces --syncs ;;
        w1) stage w1-on pagoda on bench throughput --workload W1 --backend pagoda --out "$RES/on"
            stage w1-off pagoda off bench throughput --workload W1 --backend pagoda --out "$RES/off" ;;
        w2) stage w2 pagoda on bench latency --backend pagoda --model w1 --out "$RES/on" ;;
        w3) stage w3-off w3 off
            stage w3-on w3 on ;;
        w3on) stage w3-on w3 on ;;
        *) echo "unknown stage $s" >&2 ;;
    esac
done
rm -f "$RES"/*/*.png
pack
ls -R "$RES" | head -40
