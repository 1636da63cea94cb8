"""The engine client: LLMEngine's step loop runs in its own thread, and talks to asyncio by queues.

    event loop (HTTP)                          engine thread
    add_request ── _Add ──> inbox (SimpleQueue) ──> engine.add_request, ack ─┐
    abort       ── _Abort ─>                    ──> engine.abort_request     │
    RequestStream <── loop.call_soon_threadsafe(_on_step, outputs, stats) <──┴─ engine.step()

The engine thread owns the LLMEngine: no other thread touches it, so it needs no lock, and HTTP
work (parsing, tokenizing, SSE) never holds it up; torch releases the GIL inside its kernels. One
call_soon_threadsafe per step carries every output of that step. Outputs are cumulative, so each
request keeps only its newest one: a slow reader skips ahead instead of queueing stale outputs.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

logger = logging.getLogger("pagoda.server")


class EngineDeadError(RuntimeError):
    """The engine thread has stopped; no request can be served until the server restarts."""


@dataclass(slots=True)
class _Add:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: Any
    arrival_time: float


@dataclass(slots=True)
class _Abort:
    request_ids: list[str]


_STOP = object()


class RequestStream:
    """The newest cumulative RequestOutput of one request, awaited by its HTTP handler."""

    __slots__ = ("request_id", "finished", "_latest", "_event", "_client")

    def __init__(self, request_id: str, client: AsyncEngine):
        self.request_id = request_id
        self.finished = False
        self._latest: Any = None
        self._event = asyncio.Event()
        self._client = client

    def put(self, item) -> None:
        self._latest = item
        self._event.set()

    async def get(self):
        await self._event.wait()
        self._event.clear()
        item, self._latest = self._latest, None
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.finished:
            raise StopAsyncIteration
        return await self.get()

    def close(self) -> None:
        """Abort the request in the engine unless it already finished (e.g. the client left)."""
        if not self.finished:
            self.finished = True
            self._client.abort([self.request_id])


class AsyncEngine:
    def __init__(self, engine, metrics=None, max_queue_len: int | None = None):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.max_model_len: int = engine.model_config.max_model_len
        self.metrics = metrics
        self.max_queue_len = max_queue_len
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}
        self._stats: dict = _stats_dict(engine.stats())
        self._pending: dict[str, asyncio.Future] = {}  # adds the engine thread has not answered yet
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.dead_reason: str | None = None

    @classmethod
    def from_engine_args(cls, engine_args, **kwargs) -> AsyncEngine:
        from pagoda.runtime.engine import LLMEngine

        return cls(LLMEngine.from_engine_args(engine_args), **kwargs)

    # ---- lifecycle (event loop side) ----

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="pagoda-engine", daemon=True)
        self._thread.start()

    async def shutdown(self, timeout: float = 30.0) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._inbox.put(_STOP)
            await asyncio.to_thread(self._thread.join, timeout)
        self._fail_all(EngineDeadError("the server is shutting down"))
        self.dead_reason = self.dead_reason or "the server is shutting down"

    @property
    def is_alive(self) -> bool:
        return self.dead_reason is None and self._thread is not None and self._thread.is_alive()

    def stats(self) -> dict:
        """Latest EngineStats as a dict; requests not yet taken by the engine count as waiting."""
        stats = dict(self._stats)
        stats["num_waiting"] = stats.get("num_waiting", 0) + len(self._pending)
        return stats

    def queue_full(self, num_new: int = 1) -> bool:
        """Whether num_new more waiting requests would exceed max_queue_len."""
        return self.max_queue_len is not None and self.stats()["num_waiting"] + num_new > self.max_queue_len

    # ---- requests (event loop side) ----

    async def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                          params) -> RequestStream:
        """Hand a request to the engine; returns once the engine took it (its errors raise here)."""
        if not self.is_alive:
            raise EngineDeadError(self.dead_reason or "the engine is not running")
        if request_id in self._streams or request_id in self._pending:
            raise ValueError(f"request id {request_id!r} is already in use")
        now = time.monotonic()
        future = self._loop.create_future()
        stream = RequestStream(request_id, self)
        self._streams[request_id] = stream
        if self.metrics is not None:
            self.metrics.on_arrival(request_id, now)
        self._pending[request_id] = future
        self._inbox.put(_Add(request_id, prompt, prompt_token_ids, params, now))
        try:
            await future
        except BaseException:
            self._pending.pop(request_id, None)
            self._streams.pop(request_id, None)
            if self.metrics is not None:
                self.metrics.forget(request_id)  # never served: counts nowhere
            if not future.done() or future.cancelled():
                self.abort([request_id])  # the client left before the engine answered
            raise
        return stream

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self._streams.pop(rid, None)
            if self.metrics is not None:
                self.metrics.on_abort(rid)
        if self.is_alive:
            self._inbox.put(_Abort(list(request_ids)))

    # ---- callbacks run on the event loop, scheduled by the engine thread ----

    def _on_acks(self, acks: list[tuple[str, BaseException | None]], stats) -> None:
        self._stats = stats
        for request_id, error in acks:
            future = self._pending.pop(request_id, None)
            if future is None or future.done():
                continue
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

    def _on_step(self, outputs: list, stats, now: float) -> None:
        self._stats = stats
        metrics, streams = self.metrics, self._streams
        for out in outputs:
            if metrics is not None:
                metrics.on_output(out, now)
            stream = streams.get(out.request_id)
            if stream is not None:
                stream.put(out)
                if out.finished:
                    del streams[out.request_id]

    def _on_dead(self, reason: str) -> None:
        self.dead_reason = reason
        self._fail_all(EngineDeadError(reason))

    def _fail_all(self, error: BaseException) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        for stream in self._streams.values():
            stream.put(error)
        self._streams.clear()

    def _post(self, callback, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: the server is gone
            pass

    # ---- the engine thread ----

    def _run(self) -> None:
        engine, inbox = self.engine, self._inbox
        try:
            while True:
                commands = []
                if not engine.has_unfinished_requests():
                    commands.append(inbox.get())  # idle: sleep until there is work
                while True:
                    try:
                        commands.append(inbox.get_nowait())
                    except queue.Empty:
                        break
                if commands and self._apply(engine, commands):
                    return
                if engine.has_unfinished_requests():
                    outputs = engine.step()
                    self._post(self._on_step, outputs, _stats_dict(engine.stats()), time.monotonic())
        except BaseException as exc:  # noqa: BLE001 - any failure takes the engine down
            logger.exception("engine loop failed")
            self._post(self._on_dead, f"engine error: {type(exc).__name__}: {exc}")

    def _apply(self, engine, commands: list) -> bool:
        """Apply adds and aborts; returns True when asked to stop."""
        acks, stop = [], False
        for cmd in commands:
            if cmd is _STOP:
                stop = True
            elif isinstance(cmd, _Add):
                try:
                    engine.add_request(cmd.request_id, cmd.prompt, cmd.prompt_token_ids, cmd.params,
                                       arrival_time=cmd.arrival_time)
                    acks.append((cmd.request_id, None))
                except Exception as exc:  # a bad request must not take the others down
                    acks.append((cmd.request_id, exc))
                    _safe_abort(engine, [cmd.request_id])
            else:
                _safe_abort(engine, cmd.request_ids)
        self._post(self._on_acks, acks, _stats_dict(engine.stats()))
        if stop:
            self._post(self._on_dead, "the server is shutting down")
        return stop


def _safe_abort(engine, request_ids: list[str]) -> None:
    try:
        engine.abort_request(request_ids)
    except Exception:  # an unknown or finished id is not an error worth stopping for
        logger.debug("abort of %s failed", request_ids, exc_info=True)


def _stats_dict(stats) -> dict:
    if is_dataclass(stats):
        return asdict(stats)
    return dict(stats or {})
