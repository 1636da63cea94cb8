"""The `pagoda` command. Each subcommand lives in its own module, imported only when it runs, so
that `pagoda operator` works in the operator image, which has no torch."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). Each module defines add_arguments(parser) and run(args) -> int.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("pagoda.runtime.frontend.server.cli", "Serve a model over the OpenAI-compatible HTTP API."),
    "plan": ("pagoda.runtime.plan", "Print the memory arithmetic for a model on a GPU."),
    "download": ("pagoda.runtime.download", "Download a model URI into a local folder."),
    "bench": ("pagoda.runtime.tools.bench.cli", "Benchmarks: throughput (W1), latency (W2), serve (W3)."),
    "tiny-model": ("pagoda.runtime.tools.tiny_models", "Write a tiny random-weight checkpoint."),
    "operator": ("pagoda.operator.main", "Run the Kubernetes operator."),
    "router": ("pagoda.router.cli", "Route OpenAI requests by model to many ModelServers."),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagoda", description="Pagoda: LLM serving on Kubernetes GPUs.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in SUBCOMMANDS:
        command = None
    args = build_parser(command).parse_args(argv)
    if args.command is None:
        build_parser().print_help()
        return 2
    return int(importlib.import_module(SUBCOMMANDS[args.command][0]).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
