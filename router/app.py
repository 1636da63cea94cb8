"""The router's ASGI app: the OpenAI routes it proxies, /v1/models[/{id}], /health and /metrics.

`build_app(discovery, ...)` starts the discovery, the load scraper and the upstream client in the
app's lifespan, so the app alone is the whole router (the CLI only adds uvicorn).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from contextlib import asynccontextmanager

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pagoda.router.balancing import Balancer
from pagoda.router.discovery import Discovery
from pagoda.router.fleet import Fleet
from pagoda.router.load import Loads, scrape_forever
from pagoda.router.metrics import RouterMetrics
from pagoda.router.proxy import Proxy, ProxyConfig, error, model_card, model_list, unknown_model

PROXIED = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings")


def build_app(discovery: Discovery, config: ProxyConfig | None = None, *, load_factor: float = 1.25,
              load_scrape_seconds: float = 1.0, connect_timeout: float = 5.0) -> Starlette:
    fleet, loads, metrics = Fleet(), Loads(), RouterMetrics()
    balancer = Balancer(loads, load_factor=load_factor)
    # No read timeout: a long generation may go quiet for as long as its prefill takes. trust_env is
    # off so a cluster-wide HTTP(S)_PROXY never carries pod-IP traffic.
    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=connect_timeout), trust_env=False,
                               limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
    proxy = Proxy(fleet, discovery, config or ProxyConfig(), metrics, loads, balancer, client)

    def least_load_urls():
        return [e.url for g in fleet.groups.values() if g.spec.strategy == "LeastLoad" for e in g.endpoints]

    @asynccontextmanager
    async def lifespan(_app):
        tasks = [asyncio.create_task(discovery.run(fleet), name="discovery"),
                 asyncio.create_task(scrape_forever(loads, least_load_urls, load_scrape_seconds),
                                     name="load-scraper")]
        try:
            await discovery.wait_synced()
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await client.aclose()

    async def models(_: Request) -> Response:
        return JSONResponse(model_list(fleet))

    async def model(request: Request) -> Response:
        # OpenAI's GET /v1/models/{model}; `path` because served names may hold a "/" (org/name).
        name = request.path_params["model"]
        group = fleet.lookup(name)
        if group is None:
            return unknown_model(name)
        return JSONResponse(model_card(name, group, int(time.time())))

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def prometheus(_: Request) -> Response:
        for group in fleet.groups.values():
            metrics.ready_endpoints.labels(*proxy.labels(group)).set(len(group.endpoints))
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def not_found(request: Request, _exc) -> Response:
        return error(404, f"{request.method} {request.url.path} is not a route of this router.")

    routes = [Route(path, proxy.handle, methods=["POST"]) for path in PROXIED]
    routes += [Route("/v1/models", models), Route("/v1/models/{model:path}", model), Route("/health", health),
               Route("/metrics", prometheus)]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found})
    app.state.fleet, app.state.proxy, app.state.metrics = fleet, proxy, metrics
    return app
