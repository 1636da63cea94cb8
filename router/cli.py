"""`pagoda router`: the OpenAI endpoint in front of many ModelServers (see pagoda.router)."""

from __future__ import annotations

import argparse
import logging
import os
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default: %(default)s)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--static", metavar="FILE",
                       help="a YAML file listing models and their endpoints (read again when it changes)")
    where.add_argument("--kubernetes", action="store_true",
                       help="watch ModelServers and their EndpointSlices (in-cluster or $KUBECONFIG)")
    p.add_argument("--namespace", action="append", dest="namespaces", metavar="NAMESPACE",
                   help="with --kubernetes: watch this namespace; repeat for several (default: all)")
    p.add_argument("--public-url", default=os.environ.get("PAGODA_ROUTER_URL") or None,
                   help="with --kubernetes: the router's own base URL, written into each "
                        "ModelServer's status.router (default: $PAGODA_ROUTER_URL; unset writes none)")
    p.add_argument("--hold-timeout", type=float, default=120.0,
                   help="seconds a request waits for a replica of a model at zero (default: %(default)s)")
    p.add_argument("--max-held", type=int, default=100,
                   help="requests held per model at most; more get 503 at once (default: %(default)s)")
    p.add_argument("--retry-after", type=int, default=10,
                   help="the Retry-After seconds on a 503 (default: %(default)s)")
    p.add_argument("--load-factor", type=float, default=1.25,
                   help="PrefixHash's bound on a replica's load, as a multiple of the mean (default: %(default)s)")
    p.add_argument("--load-scrape-interval", type=float, default=1.0,
                   help="seconds between scrapes of LeastLoad replicas' /metrics (default: %(default)s)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from pagoda.router.app import build_app
    from pagoda.router.proxy import ProxyConfig

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream request is uvicorn's job
    try:
        if args.static:
            from pagoda.router.static import StaticDiscovery

            discovery = StaticDiscovery(args.static)
        else:
            from pagoda.router.kube import KubernetesDiscovery

            discovery = KubernetesDiscovery(namespaces=args.namespaces, public_url=args.public_url)
    except (OSError, ValueError) as exc:
        print(f"pagoda router: {exc}", file=sys.stderr)
        return 2
    config = ProxyConfig(hold_timeout_seconds=args.hold_timeout, max_held_per_model=args.max_held,
                         retry_after_seconds=args.retry_after)
    app = build_app(discovery, config, load_factor=args.load_factor,
                    load_scrape_seconds=args.load_scrape_interval)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    return 0
