"""`pagoda bench {throughput,latency,serve,model}`: the benchmarks of BENCHMARKS.md.

Each bench module defines add_arguments(parser) and run(args) -> int. None of them imports torch
or transformers at import time (serve needs neither), so building the parser stays cheap.
"""

from __future__ import annotations

import argparse
import importlib

BENCHES: dict[str, tuple[str, str]] = {
    "throughput": ("pagoda.runtime.tools.bench.throughput", "W1/W4/W5: offline throughput (output tok/s), Pagoda or the HF peer."),
    "latency": ("pagoda.runtime.tools.bench.latency", "W2: single-stream time per output token, Pagoda or the HF peer."),
    "serve": ("pagoda.runtime.tools.bench.serve", "W3: load generator for any OpenAI-compatible server."),
    "model": ("pagoda.runtime.tools.bench.cli", "Write a synthetic model folder (w1, w4, w5, tiny) (config + tokenizer)."),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name, (module, help_text) in BENCHES.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # The result files rebuild the full command line from this parser (results.command_line).
        p.set_defaults(_parser=p)
        _module_add_arguments(module, p)


def _module_add_arguments(module: str, parser) -> None:
    if module == __name__:
        parser.add_argument("name", choices=["w1", "w4", "w5", "tiny"])
        parser.add_argument("path", nargs="?", default=None, help="default: ~/.cache/pagoda/bench-models/NAME")
        return
    importlib.import_module(module).add_arguments(parser)


def run(args) -> int:
    if args.bench == "model":
        from pagoda.runtime.tools.bench.workloads import model_folder

        print(model_folder(args.name, args.path))
        return 0
    return int(importlib.import_module(BENCHES[args.bench][0]).run(args) or 0)
