#!/usr/bin/env bash
# down.sh DIR: stop exactly the processes up.sh DIR started (DIR/pids), newest first (kwok and the
# controllers before the API server, the API server before etcd), each waited for. Safe to run
# twice, or after an up.sh that failed half-way.
set -uo pipefail
dir="${1:?usage: down.sh DIR}"
pids="$dir/pids"
[ -f "$pids" ] || exit 0
# Each component leads its own session (setsid): signal the group, so children go too.
tac "$pids" | while read -r pid name; do
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || continue
  deadline=$(( $(date +%s) + 10 ))   # a test cluster: its data is thrown away
  while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "down.sh: $name ($pid) ignored SIGTERM for 10 s; killing it" >&2
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
done
rm -f "$pids"
