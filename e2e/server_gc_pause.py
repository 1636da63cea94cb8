"""How long one full garbage collection holds `pagoda serve`'s process, with and without its startup
heap frozen (runtime/frontend/server/cli.freeze_startup_heap), on this machine.

    .venv/bin/python e2e/server_gc_pause.py [--model e2e/demo-model] [--device cpu] [--out FILE]
        [--load RATE --num-prompts N --freeze on|off]

It builds the server as `pagoda serve` does (the engine in its own process by default), then times
gc.collect() three times before and three times after the freeze. With --load it serves instead
(uvicorn in a thread of this process, frozen or not as `--freeze` says) while `pagoda bench serve`
sends N requests at RATE from a process of its own, and reports every collection the server process
ran under that load (gc.callbacks: generation and duration) beside the run's TTFT and ITL. A full collection runs on the
event loop that streams every request's tokens, so its length is a pause in every stream and
before every waiting first token. Host-side figures: they depend on the CPU, not on the GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time


def timed_collections(n: int = 3) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        gc.collect()
        out.append(round((time.perf_counter() - start) * 1e3, 2))
    return out


def under_load(app, args, env: dict) -> int:
    """Serve `app` while a bench run loads it; the server process's collections during the run."""
    import subprocess
    import tempfile
    import threading
    from pathlib import Path

    import uvicorn

    from pagoda.runtime.frontend.server import cli as serve_cli

    with socket_free() as port:
        pass  # (the port is only reserved while this block runs; uvicorn binds it next)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    if args.freeze == "on":
        serve_cli.freeze_startup_heap()
    collections, began = [], {}

    def watch(phase, info):
        if phase == "start":
            began["t"] = time.perf_counter()
        else:
            collections.append((info["generation"], (time.perf_counter() - began["t"]) * 1e3))

    gc.callbacks.append(watch)
    with tempfile.TemporaryDirectory() as out:
        bench = subprocess.run(
            [sys.executable, "-m", "pagoda.runtime.cli", "bench", "serve", "--base-url", f"http://127.0.0.1:{port}/v1",
             "--request-rate", str(args.load), "--num-prompts", str(args.num_prompts), "--input-len", "128:512",
             "--output-len", "16:64", "--warmup-prompts", "0", "--tokenizer", args.model, "--no-progress", "--out", out],
            capture_output=True, text=True, timeout=1800)
        gc.callbacks.remove(watch)
        results = [json.loads(f.read_text()) for f in Path(out).glob("W3-*.json")]
    rate = results[0]["rates"][0] if results else {}
    by_gen = {g: [ms for gen, ms in collections if gen == g] for g in (0, 1, 2)}
    record = {"workload": "server-gc-under-load", **env, "model": args.model, "freeze": args.freeze,
              "request_rate": args.load, "num_prompts": args.num_prompts,
              "collections": {str(g): {"count": len(v), "total_ms": round(sum(v), 1), "max_ms": round(max(v, default=0), 2)}
                              for g, v in by_gen.items()},
              **{k: rate.get(k) for k in ("completed", "failed", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99",
                                          "tpot_ms_p50", "tpot_ms_p99")},
              "bench_rc": bench.returncode}
    if bench.returncode:
        record["bench_stderr"] = bench.stderr[-2000:]
    print(json.dumps(record, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
    sys.stdout.flush()
    os._exit(0 if bench.returncode == 0 else 1)


class socket_free:
    """A free loopback port (closed again before the server binds it)."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return self.sock.getsockname()[1]

    def __exit__(self, *exc) -> None:
        self.sock.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="e2e/demo-model")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    p.add_argument("--load", type=float, default=None, help="serve a bench run at this request rate")
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--freeze", choices=("on", "off"), default="on", help="with --load: freeze before serving")
    args = p.parse_args(argv)

    from pagoda.runtime.cli import build_parser
    from pagoda.runtime.frontend.server import cli as serve_cli
    from pagoda.runtime.tools.bench.results import environment

    serve_args = build_parser("serve").parse_args(["serve", args.model, "--device", args.device, "--log-level",
                                                   "warning"])
    serve_cli.configure_logging("warning")
    app = serve_cli.build_server(serve_args)
    if args.load is not None:
        return under_load(app, args, environment())
    record = {"workload": "server-gc-pause", **environment(), "model": args.model, "device": args.device,
              "tracked_objects": len(gc.get_objects()), "full_collection_ms": timed_collections()}
    serve_cli.freeze_startup_heap()
    record |= {"frozen_objects": gc.get_freeze_count(), "tracked_after_freeze": len(gc.get_objects()),
               "full_collection_after_freeze_ms": timed_collections()}
    print(json.dumps(record, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
    sys.stdout.flush()
    del app
    os._exit(0)  # the engine process goes with this one; no orderly shutdown needed for a measurement


if __name__ == "__main__":
    sys.exit(main())
