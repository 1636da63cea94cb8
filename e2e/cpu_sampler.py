"""CPU use of every Pagoda process while a benchmark runs, to see which one saturates a core.

    python e2e/cpu_sampler.py OUT.json [--match pagoda.runtime] [--interval 0.5] &
    ... run the benchmark ...
    kill -TERM $!      # writes OUT.json

Every interval it reads /proc/<pid>/stat and /proc/<pid>/task/<tid>/stat of each process whose
command line contains --match (rescanned each tick, so processes that start later are picked up),
and keeps per process and per thread: CPU seconds, and the busiest interval's utilisation. A
process near 100% of one core in its busy intervals is the bottleneck of a single-threaded loop
(the engine's step loop, the server's event loop, or the load generator's). Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(stat_path: str) -> tuple[str, float] | None:
    try:
        text = Path(stat_path).read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1: text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    return name, (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def matching_pids(match: str) -> dict[int, str]:
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if match in cmd:
            found[int(entry)] = cmd.strip()[:200]
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--match", default="pagoda.runtime")
    p.add_argument("--interval", type=float, default=0.5)
    args = p.parse_args()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    procs: dict[int, dict] = {}
    last: dict[str, float] = {}
    start = time.monotonic()
    while not stop:
        t0 = time.monotonic()
        for pid, cmd in matching_pids(args.match).items():
            proc = procs.setdefault(pid, {"cmd": cmd, "cpu_s": 0.0, "max_util": 0.0, "threads": {}})
            for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
                got = cpu_seconds(f"/proc/{pid}/task/{tid}/stat")
                if got is None:
                    continue
                name, secs = got
                key = f"{pid}/{tid}"
                delta = secs - last.get(key, secs)
                last[key] = secs
                th = proc["threads"].setdefault(tid, {"name": name, "cpu_s": 0.0, "max_util": 0.0})
                th["cpu_s"] += delta
                th["max_util"] = max(th["max_util"], delta / args.interval)
            total = sum(t["cpu_s"] for t in proc["threads"].values())
            proc["max_util"] = max(proc["max_util"], (total - proc["cpu_s"]) / args.interval)
            proc["cpu_s"] = total
        time.sleep(max(0.0, args.interval - (time.monotonic() - t0)))
    wall = time.monotonic() - start
    for proc in procs.values():
        proc["mean_util"] = round(proc["cpu_s"] / wall, 3)
        proc["cpu_s"], proc["max_util"] = round(proc["cpu_s"], 2), round(proc["max_util"], 2)
        busy = sorted(proc["threads"].items(), key=lambda kv: -kv[1]["cpu_s"])[:8]
        proc["threads"] = {tid: {k: (round(v, 2) if isinstance(v, float) else v) for k, v in th.items()}
                           for tid, th in busy if th["cpu_s"] > 0.05}
    Path(args.out).write_text(json.dumps({"wall_s": round(wall, 2), "interval_s": args.interval,
                                          "processes": procs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
