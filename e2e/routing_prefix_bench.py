"""The prefix-routing figure (issue 23): does a fleet behind `pagoda router` keep the prefix cache
a single replica would have?

Workload: 400 chat requests, each one of 8 shared system prompts (drawn with random.Random(0))
followed by a user turn no other request has, `max_tokens=1` (prefill is what the cache saves).
It runs three times, each on freshly started `pagoda serve` processes of the demo model on the CPU:

- single:      one replica takes every request;
- PrefixHash:  4 replicas behind the router, consistent hashing with bounded loads over the first
               100 characters (the system prompt's opening);
- RoundRobin:  the same 4 replicas' worth, in turn: the baseline that splits every prompt's cache.

The hit rate is the replicas' own counters, prefix_cache_hits / prefix_cache_queries (prompt tokens
found in the cache over prompt tokens looked up), summed over the fleet. The figure is
`hit_rate_ratio_to_single_replica` = PrefixHash fleet / single replica, target >= 0.9.

Two cache sizes: `ample` (--num-kv-blocks 256, 4k tokens, every system prompt fits in one replica;
the figure) and `tight` (--num-kv-blocks 96: one replica holds about four of the eight prompts, so
the fleet's four caches together hold what one cannot).

    python e2e/routing_prefix_bench.py [--out e2e/results] [--requests 400] [--replicas 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
DEMO_MODEL = ROOT / "e2e" / "demo-model"
MODEL = "pagoda-demo"
NUM_SYSTEM_PROMPTS = 8
SYSTEM_PROMPT_CHARS = 1200
CACHES = {"ample": 256, "tight": 96}
# Stdlib modules whose opening source makes the system prompts: code, as the demo model knows it.
MODULES = ("argparse", "json/__init__", "logging/__init__", "pathlib", "shutil", "subprocess", "tempfile",
           "textwrap", "dataclasses", "functools")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def system_prompts() -> list[str]:
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    prompts = []
    for name in MODULES:
        path = stdlib / f"{name}.py"
        if path.exists() and len(prompts) < NUM_SYSTEM_PROMPTS:
            source = path.read_text(encoding="utf-8")[:SYSTEM_PROMPT_CHARS]
            prompts.append(f"You maintain the module `{name}`. It begins:\n{source}\nAnswer with code.")
    assert len(prompts) == NUM_SYSTEM_PROMPTS, prompts
    return prompts


def requests(n: int) -> list[list[dict]]:
    rng = random.Random(0)
    systems = system_prompts()
    out = []
    for i in range(n):
        system = systems[rng.randrange(len(systems))]
        words = " ".join(rng.choice(["parse", "sort", "merge", "cache", "retry", "split", "load", "check"])
                         for _ in range(6))
        out.append([{"role": "system", "content": system},
                    {"role": "user", "content": f"Task {i}: write a helper to {words} (id {rng.getrandbits(32):08x})."}])
    return out


def wait_healthy(url: str, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited with {process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{url} not healthy within {timeout} s")


@contextlib.contextmanager
def processes(cmds: list[list[str]], logs: Path):
    started = []
    try:
        for i, cmd in enumerate(cmds):
            log = open(logs / f"proc-{i}.log", "wb")
            started.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT), log))
        yield [p for p, _ in started]
    finally:
        for p, _ in started:
            p.terminate()
        for p, log in started:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
            log.close()


def cache_counters(url: str) -> tuple[float, float]:
    """(prefix_cache_hits, prefix_cache_queries) of one replica; either metric prefix is read."""
    text = httpx.get(f"{url}/metrics", timeout=10, trust_env=False).text
    found = {}
    for family in text_string_to_metric_families(text):
        for kind in ("prefix_cache_hits", "prefix_cache_queries"):
            if family.name in (f"pagoda:{kind}", f"vllm:{kind}"):
                found[kind] = sum(s.value for s in family.samples if s.name.endswith("_total"))
    return found["prefix_cache_hits"], found["prefix_cache_queries"]


async def drive(router_url: str, conversations: list[list[dict]], concurrency: int) -> int:
    failures = 0
    queue = list(enumerate(conversations))
    async with httpx.AsyncClient(base_url=router_url, timeout=300, trust_env=False) as client:

        async def worker():
            nonlocal failures
            while queue:
                _, messages = queue.pop(0)
                reply = await client.post("/v1/chat/completions", json={
                    "model": MODEL, "messages": messages, "max_tokens": 1, "temperature": 0})
                failures += reply.status_code != 200

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return failures


def run_one(strategy: str, replicas: int, num_kv_blocks: int, conversations, concurrency: int) -> dict:
    ports = [free_port() for _ in range(replicas)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    serve = [[sys.executable, "-m", "pagoda.runtime.cli", "serve", str(DEMO_MODEL), "--served-model-name", MODEL,
              "--host", "127.0.0.1", "--port", str(p), "--dtype", "float32", "--device", "cpu",
              "--num-kv-blocks", str(num_kv_blocks), "--log-level", "warning"] for p in ports]
    with tempfile.TemporaryDirectory() as tmp:
        static = Path(tmp) / "models.yaml"
        static.write_text(yaml.safe_dump({"models": [{"name": MODEL, "endpoints": urls,
                                                      "loadBalancing": {"strategy": strategy}}]}))
        router_port = free_port()
        router = [sys.executable, "-m", "pagoda.runtime.cli", "router", "--static", str(static), "--host",
                  "127.0.0.1", "--port", str(router_port), "--log-level", "warning"]
        with processes(serve + [router], Path(tmp)) as procs:
            router_url = f"http://127.0.0.1:{router_port}"
            for url, proc in zip(urls + [router_url], procs):
                wait_healthy(url, proc)
            before = [cache_counters(u) for u in urls]
            started = time.monotonic()
            failures = asyncio.run(drive(router_url, conversations, concurrency))
            wall = time.monotonic() - started
            after = [cache_counters(u) for u in urls]
    per_replica = [{"hits": a[0] - b[0], "queries": a[1] - b[1]} for a, b in zip(after, before)]
    hits = sum(r["hits"] for r in per_replica)
    queries = sum(r["queries"] for r in per_replica)
    return {"strategy": strategy, "replicas": replicas, "num_kv_blocks": num_kv_blocks, "failed": failures,
            "hit_rate": hits / queries if queries else 0.0, "prefix_cache_hits": hits,
            "prefix_cache_queries": queries, "per_replica": per_replica, "wall_s": round(wall, 2)}


def git_commit() -> str:
    with contextlib.suppress(Exception):
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    return "unknown"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "e2e" / "results"))
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--caches", nargs="+", default=list(CACHES), choices=list(CACHES))
    args = p.parse_args(argv)
    conversations = requests(args.requests)
    result = {"workload": "routing-prefix", "backend": "pagoda", "commit": git_commit(),
              "command": "python e2e/routing_prefix_bench.py " + " ".join(argv or sys.argv[1:]),
              "model": "e2e/demo-model (fp32, CPU)", "cpu": platform.processor() or platform.machine(),
              "cpu_count": os.cpu_count(), "requests": args.requests, "system_prompts": NUM_SYSTEM_PROMPTS,
              "max_tokens": 1, "concurrency": args.concurrency, "prefix_char_length": 100, "runs": {}}
    for cache in args.caches:
        blocks = CACHES[cache]
        runs = {}
        for name, strategy, replicas in (("single", "PrefixHash", 1), ("PrefixHash", "PrefixHash", args.replicas),
                                         ("RoundRobin", "RoundRobin", args.replicas)):
            runs[name] = run_one(strategy, replicas, blocks, conversations, args.concurrency)
            print(f"{cache} {name}: hit rate {runs[name]['hit_rate']:.4f}, {runs[name]['failed']} failed, "
                  f"{runs[name]['wall_s']} s", flush=True)
        single = runs["single"]["hit_rate"]
        result["runs"][cache] = {
            **runs,
            "hit_rate_ratio_to_single_replica": runs["PrefixHash"]["hit_rate"] / single,
            "round_robin_ratio_to_single_replica": runs["RoundRobin"]["hit_rate"] / single,
        }
        print(f"{cache}: single {single:.3f}, PrefixHash {runs['PrefixHash']['hit_rate']:.3f}, "
              f"RoundRobin {runs['RoundRobin']['hit_rate']:.3f}", flush=True)
    headline = result["runs"].get("ample") or next(iter(result["runs"].values()))
    result["hit_rate_ratio_to_single_replica"] = headline["hit_rate_ratio_to_single_replica"]
    result["round_robin_ratio_to_single_replica"] = headline["round_robin_ratio_to_single_replica"]
    result["target"] = {"hit_rate_ratio_to_single_replica": ">= 0.9",
                        "passed": result["hit_rate_ratio_to_single_replica"] >= 0.9}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"routing-prefix-pagoda-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
