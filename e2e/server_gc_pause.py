"""How long one full garbage collection holds `pagoda serve`'s process, with and without its startup
heap frozen (runtime/frontend/server/cli.freeze_startup_heap), on this machine.

    .venv/bin/python e2e/server_gc_pause.py [--model e2e/demo-model] [--device cpu] [--out FILE]

It builds the server as `pagoda serve` does (the engine in its own process by default), then times
gc.collect() three times before and three times after the freeze. A full collection runs on the
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="e2e/demo-model")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)

    from pagoda.runtime.cli import build_parser
    from pagoda.runtime.frontend.server import cli as serve_cli
    from pagoda.runtime.tools.bench.results import environment

    serve_args = build_parser("serve").parse_args(["serve", args.model, "--device", args.device, "--log-level",
                                                   "warning"])
    serve_cli.configure_logging("warning")
    app = serve_cli.build_server(serve_args)
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
