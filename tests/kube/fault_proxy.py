"""A proxy in front of the API server that fails some of the operator's requests, as a flaky
network or an overloaded API server would: plain HTTP in (the operator's kubeconfig points here),
TLS to the API server out, bodies and watch streams passed through as they come.

The faults, each what a real API server or network does:
- refused: 500, 503 or 429 (with Retry-After) before the request reaches the API server;
- conflict: 409 on a write, as when someone else wrote the object first;
- lost: the request reaches the API server and takes effect, the answer is a 504 (the API server's
  own "request did not complete" time-out), so the client cannot know whether it happened;
- hung: the request takes effect, the answer never comes back within the client's time-out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import ssl
import threading
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}
REFUSED = ((500, "InternalError"), (503, "ServiceUnavailable"), (429, "TooManyRequests"))
WRITES = {"POST", "PUT", "PATCH", "DELETE"}
FAULTS = ("refused", "conflict", "lost", "hung")


def status_body(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": code,
            "reason": reason, "message": f"{message} (injected by the test's fault proxy)"}  # fmt: skip


@dataclass
class FaultProxy:
    upstream: str  # https://127.0.0.1:PORT
    ca_file: str
    rate: float = 0.1  # of the reconcile's requests (kopf's own are passed: see faulty)
    hang_seconds: float = 3600.0  # a half-open connection: no answer, ever
    seed: int = 21
    injected: list[tuple[str, str, str]] = field(default_factory=list)  # (fault, method, path)
    url: str = ""

    def faulty(self, request: web.Request) -> bool:
        # The reconcile's calls (the official client) fail; kopf's watches and its own bookkeeping
        # patches pass, so that what is tested is the operator's code, not kopf's.
        agent = request.headers.get("User-Agent", "")
        return not agent.startswith("kopf") and request.query.get("watch") not in ("true", "1")

    def choose(self, request: web.Request) -> str | None:
        if not self.faulty(request) or self._random.random() >= self.rate:
            return None
        # In turn, so that a short run meets every kind. A conflict only answers a write, and the
        # turn may skip it on every write of a short run, so the first faulted write takes it.
        if request.method in WRITES and "conflict" not in self.kinds():
            return "conflict"
        kinds = [k for k in FAULTS if k != "conflict" or request.method in WRITES]
        self._turn += 1
        return kinds[self._turn % len(kinds)]

    def kinds(self) -> set[str]:
        return {fault for fault, _, _ in self.injected}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        fault = self.choose(request)
        if fault:
            self.injected.append((fault, request.method, request.path))
        if fault == "refused":
            code, reason = self._random.choice(REFUSED)
            headers = {"Retry-After": "1"} if code == 429 else None
            return web.json_response(status_body(code, reason, "refused"), status=code, headers=headers)
        if fault == "conflict":
            body = status_body(409, "Conflict", "the object has been modified; please apply your changes "
                               "to the latest version and try again")  # fmt: skip
            return web.json_response(body, status=409)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        data = await request.read()
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=data or None,
            # The official client sends no Content-Type (the API server takes JSON); aiohttp would
            # add application/octet-stream, which the API server refuses (415).
            skip_auto_headers=["Content-Type"],
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        ) as upstream:  # fmt: skip
            if fault == "lost":
                await upstream.read()  # it happened; the client is told it timed out
                return web.json_response(status_body(504, "Timeout", "request did not complete"), status=504)
            if fault == "hung":
                await upstream.read()
                await asyncio.sleep(self.hang_seconds)  # the client has given up by now
                return web.json_response(status_body(504, "Timeout", "request did not complete"), status=504)
            response = web.StreamResponse(
                status=upstream.status, headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP}
            )
            await response.prepare(request)
            # A watch the client closes ends here: nothing to pass on any more.
            with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            return response

    def start(self) -> FaultProxy:
        self._random = random.Random(self.seed)
        self._turn = -1
        self._loop = asyncio.new_event_loop()

        async def serve():
            context = ssl.create_default_context(cafile=self.ca_file)
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context))
            app = web.Application(client_max_size=64 << 20)
            app.router.add_route("*", "/{tail:.*}", self.handle)
            self._runner = web.AppRunner(app, handler_cancellation=True)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]
            self.url = f"http://127.0.0.1:{port}"

        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(serve(), self._loop).result(30)
        return self

    def stop(self) -> None:
        async def close():
            await self._runner.cleanup()
            await self._session.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def summary(self) -> str:
        return json.dumps(self.injected[:40])
