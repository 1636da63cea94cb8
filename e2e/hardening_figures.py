"""Issue #22's figures against a real `pagoda serve` of the demo model, on the CPU:

1. /health latency (p50/p99/max) while a stream of 10 MB prompts is sent and refused;
2. a chunked body far over the body limit: its status and the server's peak memory growth;
3. the seconds from `kill -9` of the engine process to the server's exit, and its exit code.

    python e2e/hardening_figures.py [--model e2e/demo-model] [--out e2e/results]

Writes e2e/results/hardening-cpu-<time>.json. The figures are wall-clock, so they belong here and
not in tests/ (tests/server/ checks the same behaviours without timing).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from serve_process import pagoda_serve  # noqa: E402

BIG_PROMPT_BYTES = 10 << 20
BODY_LIMIT = 32 << 20  # the default --max-request-body-bytes


def health_during_big_prompts(url: str, num_prompts: int = 40, senders: int = 2) -> dict:
    latencies: list[float] = []
    statuses: list[int] = []
    refusals: list[float] = []
    done = threading.Event()
    body = json.dumps({"model": "demo", "prompt": "x " * (BIG_PROMPT_BYTES // 2), "max_tokens": 4}).encode()

    def send(count: int) -> None:
        with httpx.Client(timeout=300) as http:
            for _ in range(count):
                t = time.perf_counter()
                r = http.post(url + "/v1/completions", content=body, headers={"content-type": "application/json"})
                refusals.append(time.perf_counter() - t)
                statuses.append(r.status_code)

    def probe() -> None:
        with httpx.Client(timeout=30) as http:
            while not done.is_set():
                t = time.perf_counter()
                http.get(url + "/health")
                latencies.append(time.perf_counter() - t)
                time.sleep(0.02)

    prober = threading.Thread(target=probe)
    prober.start()
    workers = [threading.Thread(target=send, args=(num_prompts // senders,)) for _ in range(senders)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    done.set()
    prober.join()
    q = statistics.quantiles(latencies, n=100, method="inclusive")  # within the probes seen, never past them
    return {"prompt_bytes": len(body), "prompts": len(statuses), "senders": senders,
            "statuses": sorted(set(statuses)), "refusal_seconds_p50": statistics.median(refusals),
            "refusal_seconds_max": max(refusals), "health_probes": len(latencies),
            "health_ms_p50": 1000 * statistics.median(latencies), "health_ms_p99": 1000 * q[98],
            "health_ms_max": 1000 * max(latencies)}


def chunked_body_over_the_limit(url: str, pid: int, total: int = 400 << 20) -> dict:
    proc = psutil.Process(pid)
    base = proc.memory_info().rss
    peak = [base]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.01)

    def body():
        yield b'{"model": "demo", "max_tokens": 2, "prompt": "'
        piece = b"a" * (1 << 20)
        for _ in range(total >> 20):
            yield piece
        yield b'"}'

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        r = httpx.post(url + "/v1/completions", content=body(), headers={"content-type": "application/json"},
                       timeout=300)
        status = r.status_code
    except httpx.HTTPError as exc:  # the server may close the connection once it answered 413
        status = f"{type(exc).__name__}"
    done.set()
    watcher.join()
    return {"sent_bytes": total, "limit_bytes": BODY_LIMIT, "status": status,
            "rss_growth_bytes": peak[0] - base, "rss_growth_over_limit": (peak[0] - base) / BODY_LIMIT}


def exit_after_engine_death(server) -> dict:
    (engine,) = psutil.Process(server.process.pid).children()
    t = time.perf_counter()
    engine.send_signal(signal.SIGKILL)
    try:
        code = server.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        return {"exited": False, "seconds": None}
    return {"exited": True, "exit_code": code, "seconds": time.perf_counter() - t}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(ROOT / "e2e" / "demo-model"))
    p.add_argument("--out", default=str(ROOT / "e2e" / "results"))
    args = p.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    flags = ["--device", "cpu", "--served-model-name", "demo"]
    result = {"model": args.model, "host_cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}
    with pagoda_serve(args.model, *flags, log_path=Path(tempfile.gettempdir()) / f"hardening-cpu-{stamp}.log") as server:
        server.wait_healthy()
        result["health_during_10mb_prompts"] = health_during_big_prompts(server.url)
        result["chunked_body_over_limit"] = chunked_body_over_the_limit(server.url, server.process.pid)
        result["exit_after_engine_kill"] = exit_after_engine_death(server)
    path = out_dir / f"hardening-cpu-{stamp}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
