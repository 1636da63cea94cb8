"""The reverse proxy: one OpenAI request in, one replica's response out, byte for byte.

The body is read once, for its `model` (and the prompt prefix PrefixHash hashes). The reply goes
out as the replica sends it, chunk by chunk, so SSE streams stay streams. Two things run side by
side for each request: the work (hold, pick, send, relay) and a watch on the client's connection.
When the client goes first, the work is cancelled, which closes the upstream response mid-body; the
replica sees its client gone and aborts the request, freeing its KV blocks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass

import httpx
from starlette.requests import Request
from starlette.responses import Response

from pagoda.router.balancing import Balancer
from pagoda.router.discovery import Discovery
from pagoda.router.fleet import Fleet, Group
from pagoda.router.load import Loads
from pagoda.router.metrics import RouterMetrics
from pagoda.router.prefix import prefix_key
from pagoda.runtime.frontend.server.errors import error_body

logger = logging.getLogger("pagoda.router")

# RFC 9110's hop-by-hop fields, plus the ones httpx and uvicorn set for their own connection.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                        "trailer", "transfer-encoding", "upgrade", "host", "content-length"})


@dataclass(slots=True, frozen=True)
class ProxyConfig:
    max_body_bytes: int = 32 * 1024 * 1024
    hold_timeout_seconds: float = 120.0  # how long a request waits for a replica to come up
    max_held_per_model: int = 100
    retry_after_seconds: int = 10


class ClientGone(Exception):
    pass


class Proxy:
    def __init__(self, fleet: Fleet, discovery: Discovery, config: ProxyConfig, metrics: RouterMetrics,
                 loads: Loads, balancer: Balancer, client: httpx.AsyncClient):
        self.fleet = fleet
        self.discovery = discovery
        self.config = config
        self.metrics = metrics
        self.loads = loads
        self.balancer = balancer
        self.client = client
        self.held: dict[str, int] = {}

    async def handle(self, request: Request) -> Response:
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > self.config.max_body_bytes:
            return error(413, f"The request body is {length} bytes; the limit is {self.config.max_body_bytes}.",
                         code="request_too_large")
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return error(400, "The request body is not valid JSON.")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return error(400, "The request names no `model`.", param="model")
        group = self.fleet.lookup(body["model"])
        if group is None:
            return unknown_model(body["model"])
        if body["model"] != group.spec.served_name:  # an alias: the replicas know the served name
            raw = json.dumps({**body, "model": group.spec.served_name}).encode()
        return Relay(self, group, request, raw, prefix_key(body, group.spec.prefix_char_length))

    def labels(self, group: Group) -> tuple[str, str]:
        return group.spec.key, group.spec.served_name

    async def hold(self, group: Group, send) -> bool:
        """Wait for the group's first ready endpoint; False (the 503 sent) on time-out or overflow."""
        key, labels = group.spec.key, self.labels(group)
        if self.held.get(key, 0) >= self.config.max_held_per_model:
            await send_error(send, 503, f"{self.held[key]} requests for `{group.spec.served_name}` are already "
                             "waiting for a replica to start; retry later.", code="model_unavailable",
                             retry_after=self.config.retry_after_seconds)
            return False
        self.held[key] = self.held.get(key, 0) + 1
        self.metrics.queue_depth.labels(*labels).inc()
        try:
            if self.held[key] == 1:
                self.metrics.scale_from_zero.labels(*labels).inc()
                await self.discovery.scale_from_zero(group.spec)
            await asyncio.wait_for(group.ready.wait(), self.config.hold_timeout_seconds)
            return True
        except asyncio.TimeoutError:
            self.metrics.hold_timeouts.labels(*labels).inc()
            await send_error(send, 503, f"No replica of `{group.spec.served_name}` became ready within "
                             f"{self.config.hold_timeout_seconds:g} s; it may still be starting.",
                             code="model_unavailable", retry_after=self.config.retry_after_seconds)
            return False
        finally:
            self.held[key] -= 1
            self.metrics.queue_depth.labels(*labels).dec()


class Relay(Response):
    """The response object for one proxied request; all its work happens in __call__."""

    def __init__(self, proxy: Proxy, group: Group, request: Request, body: bytes, prefix: str):
        self.proxy, self.group, self.request, self.body, self.prefix = proxy, group, request, body, prefix
        self.status_code = 499  # until a status is sent: the client closed the request
        self.started = False

    async def __call__(self, scope, receive, send) -> None:
        work = asyncio.ensure_future(self._work(send))
        watch = asyncio.ensure_future(_until_disconnect(receive))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():
                work.cancel()  # the client left: closing the upstream response aborts the replica's request
            try:
                await work
            except (asyncio.CancelledError, ClientGone):
                pass
            self.proxy.metrics.requests.labels(*self.proxy.labels(self.group), str(self.status_code)).inc()

    async def _work(self, send) -> None:
        proxy, group = self.proxy, self.group
        if not group.endpoints and not await proxy.hold(group, send):
            self.status_code = 503
            return
        tried: set[str] = set()
        while True:
            endpoint = proxy.balancer.pick(group, self.prefix, exclude=tried)
            if endpoint is None:
                self.status_code = 503
                await send_error(send, 503, f"No replica of `{group.spec.served_name}` could be reached.",
                                 code="upstream_unavailable", retry_after=proxy.config.retry_after_seconds)
                return
            tried.add(endpoint.url)
            try:
                await self._relay(endpoint, send)
                return
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                # Nothing reached the replica, so another one may take the request.
                logger.warning("router: %s unreachable (%s); trying another replica", endpoint.url, exc)
            except httpx.HTTPError as exc:
                if self.started:
                    raise  # mid-response: all that is left is to cut the client's connection too
                self.status_code = 503
                await send_error(send, 503, f"The replica at {endpoint.url} failed: {exc!r}",
                                 code="upstream_error", retry_after=proxy.config.retry_after_seconds)
                return

    async def _relay(self, endpoint, send) -> None:
        proxy, request = self.proxy, self.request
        labels = proxy.labels(self.group)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        upstream_request = proxy.client.build_request(request.method, endpoint.url + request.url.path,
                                                      params=request.url.query or None, headers=headers,
                                                      content=self.body)
        with proxy.loads.track(endpoint.url):
            proxy.metrics.in_flight.labels(*labels).inc()
            try:
                upstream = await proxy.client.send(upstream_request, stream=True)
                proxy.metrics.upstream_requests.labels(*labels, endpoint.label).inc()
                try:
                    self.status_code = upstream.status_code
                    out_headers = [(k.encode("latin-1"), v.encode("latin-1"))
                                   for k, v in upstream.headers.multi_items() if k.lower() not in HOP_BY_HOP]
                    if "content-length" in upstream.headers and "content-encoding" not in upstream.headers:
                        out_headers.append((b"content-length", upstream.headers["content-length"].encode()))
                    await send({"type": "http.response.start", "status": upstream.status_code,
                                "headers": out_headers})
                    self.started = True
                    async for chunk in upstream.aiter_raw():
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                finally:
                    await upstream.aclose()
            finally:
                proxy.metrics.in_flight.labels(*labels).dec()


async def _until_disconnect(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def error(status: int, message: str, *, param: str | None = None, code: str | None = None,
          retry_after: int | None = None) -> Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return Response(json.dumps(error_body(status, message, param=param, code=code)), status_code=status,
                    media_type="application/json", headers=headers)


def unknown_model(name: str) -> Response:
    return error(404, f"The model `{name}` does not exist. GET /v1/models lists the models this router serves.",
                 param="model", code="model_not_found")


async def send_error(send, status: int, message: str, **kw) -> None:
    response = error(status, message, **kw)
    await send({"type": "http.response.start", "status": status, "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})


def model_card(name: str, group: Group, now: int) -> dict:
    """One entry of OpenAI's model list, with the ModelServer and the replicas ready behind it."""
    return {"id": name, "object": "model", "created": now, "owned_by": "pagoda", "root": group.spec.served_name,
            "model_server": group.spec.key, "ready_replicas": len(group.endpoints)}


def model_list(fleet: Fleet) -> dict:
    """OpenAI's model list: every served name and alias."""
    now = int(time.time())
    return {"object": "list", "data": [model_card(name, group, now) for name, group in fleet.names()]}
