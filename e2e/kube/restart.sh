#!/usr/bin/env bash
# restart.sh DIR NAME: stop one component that up.sh DIR started and start it again with the same
# command line (DIR/cmd/NAME), its log appended to, DIR/pids updated.
#
# The tests restart the controller-manager once they have installed CRDs: its garbage collector
# rediscovers resource kinds only every 30 s (a constant in Kubernetes), and until it knows a kind
# it neither collects objects of that kind nor sees the deletion of an owner of that kind.
set -euo pipefail
dir="${1:?usage: restart.sh DIR NAME}"
name="${2:?usage: restart.sh DIR NAME}"
pids="$dir/pids"
pid="$(awk -v name="$name" '$2 == name {print $1}' "$pids")"
[ -n "$pid" ] && [ -f "$dir/cmd/$name" ] || { echo "restart.sh: $name was not started by up.sh $dir" >&2; exit 1; }
kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
deadline=$(( $(date +%s) + 10 ))
while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.1; done
kill -KILL -- "-$pid" 2>/dev/null || true
mapfile -d '' cmd < "$dir/cmd/$name"
setsid "${cmd[@]}" >> "$dir/logs/$name.log" 2>&1 < /dev/null &
new=$!
# The same line, in the same place: down.sh stops components newest first.
awk -v name="$name" -v new="$new" '$2 == name {$1 = new} {print}' "$pids" > "$pids.tmp" && mv "$pids.tmp" "$pids"
