"""`pagoda operator`: run the kopf operator with Pagoda's handlers.

pagoda operator --all-namespaces --liveness http://0.0.0.0:8080/healthz
pagoda operator --namespace models --namespace staging
pagoda operator --all-namespaces --peering pagoda     # one of several replicas (the chart's way)

Replicas (and a developer's operator on a laptop) coordinate by kopf's peering: each one keeps
itself alive in the ClusterKopfPeering (or, watching namespaces, the KopfPeering in each) named
by --peering; only the one of highest priority works, the others stand by with their watches
paused, and take over once it leaves or stops renewing (settings.peering.lifetime in handlers.py).
"""

from __future__ import annotations

import argparse
import os
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)"
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch every namespace (the default)"
    )
    parser.add_argument(
        "--liveness", metavar="URL", help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz"
    )
    parser.add_argument("--runtime-image", help="default runtime image (env PAGODA_RUNTIME_IMAGE)")
    parser.add_argument(
        "--resync-seconds", type=float, help="re-read every ModelServer this often (default 30)"
    )
    parser.add_argument(
        "--peering", metavar="NAME", default=os.environ.get("PAGODA_PEERING") or None,
        help="coordinate with the other replicas through kopf's peering object NAME (env PAGODA_PEERING); "
        "without it the operator runs standalone and must be the only one",
    )  # fmt: skip
    parser.add_argument(
        "--priority", type=int, default=None,
        help="peering priority: the highest one works (default: the earlier a replica started, the higher, "
        "so a rolling update never takes the work from a replica in the middle of it)",
    )  # fmt: skip
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--debug", action="store_true")


def run(args: argparse.Namespace) -> int:
    from pagoda.operator import config

    settings = config.OperatorConfig.from_env().with_overrides(
        runtime_image=args.runtime_image, resync_seconds=args.resync_seconds
    )
    # Before the handlers' import: kopf fixes their timers' intervals when they are registered.
    config.install(settings)

    import kopf

    import pagoda.operator.handlers  # noqa: F401 - registers the handlers

    kopf.configure(verbose=args.verbose, debug=args.debug)
    kopf_settings = kopf.OperatorSettings()
    # Watching named namespaces, the chart grants no cluster-wide read of Namespaces or CRDs. Say
    # so to kopf (its documented restricted mode): otherwise it retries both listings through its
    # error backoffs, about a minute, before it falls back to this same mode and starts serving.
    kopf_settings.scanning.disabled = bool(args.namespace)
    kopf.run(
        settings=kopf_settings,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness,
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=(args.priority if args.priority is not None else startup_priority()) if args.peering else None,
        memo=kopf.Memo(config=settings),
    )
    return 0


def startup_priority() -> int:
    """Earlier start, higher priority (negative microseconds since the epoch): the replica that has
    been working keeps working, a new one waits; a developer's `--priority 0` outranks them all."""
    return -(time.time_ns() // 1000)
