"""What the HTTP side sees of the engine, whichever way the engine core runs.

Two engine clients share this event-loop half: AsyncEngine (server/async_engine.py) steps
LLMEngine in a thread of this process; ProcessEngine (server/process_engine.py) steps it in a child
process (server/engine_proc.py), so the step loop never waits on the GIL for HTTP work. Both hand
every request a RequestStream of cumulative RequestOutputs, and both apply the same commands
(`apply_commands`) on the engine's side.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

logger = logging.getLogger("pagoda.server")


class EngineDeadError(RuntimeError):
    """The engine has stopped; no request can be served until the server restarts."""


@dataclass(slots=True)
class AddCommand:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: Any
    arrival_time: float


@dataclass(slots=True)
class AbortCommand:
    request_ids: list[str]


class StopCommand:
    """Ask the engine loop to return; picklable, so it crosses to the engine process too."""


class RequestStream:
    """The newest cumulative RequestOutput of one request, awaited by its HTTP handler. A reader
    that falls behind skips to the newest output: its next chunk carries everything it missed."""

    __slots__ = ("request_id", "finished", "_latest", "_event", "_client")

    def __init__(self, request_id: str, client: EngineClient):
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


class EngineClient:
    """The event-loop half. Subclasses start the engine side and implement _send and _running."""

    tokenizer: Any
    max_model_len: int
    vocab_size: int | None
    memory_plan: Any

    def __init__(self, metrics=None, max_queue_len: int | None = None, stats: dict | None = None):
        self.metrics = metrics
        self.max_queue_len = max_queue_len
        self._streams: dict[str, RequestStream] = {}
        self._stats: dict = stats or {}
        self._pending: dict[str, asyncio.Future] = {}  # adds the engine has not answered yet
        self._loop: asyncio.AbstractEventLoop | None = None
        self.dead_reason: str | None = None

    # ---- to implement ----

    def _send(self, command) -> None:
        raise NotImplementedError

    def _running(self) -> bool:
        raise NotImplementedError

    # ---- state ----

    @property
    def is_alive(self) -> bool:
        return self.dead_reason is None and self._running()

    def stats(self) -> dict:
        """Latest EngineStats as a dict; requests not yet taken by the engine count as waiting."""
        stats = dict(self._stats)
        stats["num_waiting"] = stats.get("num_waiting", 0) + len(self._pending)
        return stats

    def queue_full(self, num_new: int = 1) -> bool:
        """Whether num_new more waiting requests would exceed max_queue_len."""
        return self.max_queue_len is not None and self.stats()["num_waiting"] + num_new > self.max_queue_len

    # ---- requests ----

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
        self._on_add(request_id, prompt, prompt_token_ids, params, now)
        self._send(AddCommand(request_id, prompt, prompt_token_ids, params, now))
        try:
            await future
        except BaseException:
            self._pending.pop(request_id, None)
            self._streams.pop(request_id, None)
            self._on_forget(request_id)
            if self.metrics is not None:
                self.metrics.forget(request_id)  # never served: counts nowhere
            if not future.done() or future.cancelled():
                self.abort([request_id])  # the client left before the engine answered
            raise
        return stream

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self._streams.pop(rid, None)
            self._on_forget(rid)
            if self.metrics is not None:
                self.metrics.on_abort(rid)
        if self.is_alive:
            self._send(AbortCommand(list(request_ids)))

    def _on_add(self, request_id, prompt, prompt_token_ids, params, arrival_time) -> None:
        """Hook: the process client starts assembling this request's outputs."""

    def _on_forget(self, request_id: str) -> None:
        """Hook: the request will get no more outputs on this side."""

    # ---- callbacks, run on the event loop ----

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
        if self.dead_reason is None:
            self.dead_reason = reason
        self._fail_all(EngineDeadError(self.dead_reason))

    def _fail_all(self, error: BaseException) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        for stream in self._streams.values():
            stream.put(error)
        for rid in list(self._streams):
            self._on_forget(rid)
        self._streams.clear()

    def _post(self, callback, *args) -> None:
        """Schedule a callback on the event loop from another thread."""
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: the server is gone
            pass


# ---- the engine's side: the same in its thread and in its process ----


def apply_commands(engine, commands: list) -> tuple[list[tuple[str, BaseException | None]], bool]:
    """Apply adds and aborts in order; returns the adds' acks and whether a stop was asked."""
    acks, stop = [], False
    for cmd in commands:
        if isinstance(cmd, StopCommand):
            stop = True
        elif isinstance(cmd, AddCommand):
            try:
                engine.add_request(cmd.request_id, cmd.prompt, cmd.prompt_token_ids, cmd.params,
                                   arrival_time=cmd.arrival_time)
                acks.append((cmd.request_id, None))
            except Exception as exc:  # a bad request must not take the others down
                acks.append((cmd.request_id, exc))
                safe_abort(engine, [cmd.request_id])
        else:
            safe_abort(engine, cmd.request_ids)
    return acks, stop


def safe_abort(engine, request_ids: list[str]) -> None:
    try:
        engine.abort_request(request_ids)
    except Exception:  # an unknown or finished id is not an error worth stopping for
        logger.debug("abort of %s failed", request_ids, exc_info=True)


def stats_dict(stats) -> dict:
    if is_dataclass(stats):
        return asdict(stats)
    return dict(stats or {})
