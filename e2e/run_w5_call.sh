#!/usr/bin/env bash
# One device call of issue 18's W5 work: run_w5.sh's stages into /tmp/w5 (kept on the machine while
# it stays warm, so a later call's vllm stage finds this call's Pagoda result as its peer), packing
# /tmp/w5 into OUT/w5.tgz after each stage, so a call cut off by its limit still brings back what
# finished (a device call returns few files).
#   PAGODA_COMMIT=abc1234 bash e2e/run_w5_call.sh STAGE...
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?OUT, the device call output folder}"
rc=0
for stage in "$@"; do
    bash e2e/run_w5.sh /tmp/w5 "$stage" > "/tmp/w5-$stage.log" 2>&1 || rc=1
    tail -n 12 "/tmp/w5-$stage.log"
    cp "/tmp/w5-$stage.log" /tmp/w5/ 2>/dev/null
    tar -C /tmp -czf "$OUT/w5.tgz" w5
done
exit $rc
