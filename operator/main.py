"""`pagoda operator`: run the kopf operator with Pagoda's handlers.

pagoda operator --all-namespaces --liveness http://0.0.0.0:8080/healthz
pagoda operator --namespace models --namespace staging
"""

from __future__ import annotations

import argparse
import os


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
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--debug", action="store_true")


def run(args: argparse.Namespace) -> int:
    # The handlers module reads these at import (a kopf timer's interval is fixed when registered).
    if args.runtime_image:
        os.environ["PAGODA_RUNTIME_IMAGE"] = args.runtime_image
    if args.resync_seconds:
        os.environ["PAGODA_RESYNC_SECONDS"] = str(args.resync_seconds)

    import kopf

    import pagoda.operator.handlers  # noqa: F401 - registers the handlers
    from pagoda.operator.config import OperatorConfig

    kopf.configure(verbose=args.verbose, debug=args.debug)
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness,
        standalone=True,  # one replica, no peering CRDs: leader election is not needed for this
        memo=kopf.Memo(config=OperatorConfig.from_env()),
    )
    return 0
