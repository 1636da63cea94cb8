"""What the HTTP side sees of the engine, whichever way the engine core runs.

Two engine clients share this event-loop half: AsyncEngine (frontend/async_engine.py) runs the
core loop in a thread of this process; ProcessEngine (frontend/process_engine.py) runs it in a
child process (core/engine_proc.py), so the step loop never waits on the GIL for HTTP work. Both
speak the core loop's commands (core/core_loop.py) and receive its per-step records; everything
a record becomes (text, stop strings, logprob dicts, metrics) is made here, by the frontend's
InputProcessor and OutputProcessor, on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from pagoda.runtime.core.core_loop import AbortCommand, AddCommand, InitStructuredOutputsCommand
from pagoda.runtime.frontend.output_processor import output_processor_for
from pagoda.runtime.frontend.processor import InputProcessor
from pagoda.runtime.model_config import ModelConfig, generation_defaults
from pagoda.runtime.pooling_config import pooler_config_for, prefix_caching_for
from pagoda.runtime.sampling_params import RequestOutputKind

logger = logging.getLogger("pagoda.server")


class EngineDeadError(RuntimeError):
    """The engine has stopped; no request can be served until the server restarts."""


# A dead engine runs and queues nothing. Left at their last values, these gauges would read to an
# autoscaler as a queue that never drains; the counters keep their totals (they never go down).
DEAD_GAUGES = {"num_running": 0, "num_waiting": 0, "kv_cache_usage": 0.0, "kv_capacity_tokens": 0}


class RequestStream:
    """The outputs of one request, awaited by its HTTP handler. A reader that falls behind gets
    one output for everything it missed: the newest CUMULATIVE one, or the DELTAs folded together."""

    __slots__ = ("request_id", "finished", "_latest", "_event", "_client", "_merge")

    def __init__(self, request_id: str, client: EngineClient, output_kind: RequestOutputKind):
        self.request_id = request_id
        self.finished = False
        self._latest: Any = None
        self._event = asyncio.Event()
        self._client = client
        self._merge = output_kind == RequestOutputKind.DELTA

    def put(self, item) -> None:
        latest = self._latest
        if self._merge and latest is not None and not isinstance(latest, BaseException) \
                and not isinstance(item, BaseException):
            latest.add(item)
        else:
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

    memory_plan: Any

    def __init__(self, engine_args, model_config: ModelConfig, tokenizer, stats: dict | None = None,
                 max_queue_len: int | None = None):
        self.tokenizer = tokenizer
        self.model_config = model_config
        self.max_model_len: int = model_config.max_model_len
        self.vocab_size: int | None = model_config.vocab_size
        self.max_queue_len = max_queue_len
        self.processor = InputProcessor(model_config, tokenizer, engine_args.max_logprobs,
                                        engine_args.structured_outputs_disable_any_whitespace)
        # Sampling defaults for what a request leaves unset (generation_config.json).
        self.generation_defaults = generation_defaults(engine_args.generation_config, model_config.path)
        self.enable_log_requests = engine_args.enable_log_requests
        # --runner pooling: /v1/embeddings instead of text (pooling_config.py).
        self.pooler_config = pooler_config_for(engine_args.runner, model_config.path, model_config.architecture,
                                               engine_args.pooler_config)
        self.processor.pooling = self.pooler_config is not None
        self.output_processor = output_processor_for(tokenizer, self.pooler_config)
        self._streams: dict[str, RequestStream] = {}
        self._stats: dict = stats or {}
        self._pending: dict[str, asyncio.Future] = {}  # adds the engine has not answered yet
        self._loop: asyncio.AbstractEventLoop | None = None
        self.dead_reason: str | None = None
        self._cache_config = {"block_size": engine_args.block_size,
                              "enable_prefix_caching": prefix_caching_for(
                                  engine_args.enable_prefix_caching,
                                  self.pooler_config.pooling_type if self.pooler_config else None),
                              "cache_dtype": "auto"}
        self._grammars_init: asyncio.Future | None = None  # the TokenizerInfo sent to the core
        self._stopping = False  # set by shutdown(): the engine's end is then no death
        # Called once, on the event loop, with the reason, when the engine dies while serving;
        # `pagoda serve` exits so that the pod restarts (server/cli.py).
        self.on_engine_death: list[Callable[[str], None]] = []

    @property
    def metrics(self):
        return self.output_processor.metrics

    @metrics.setter
    def metrics(self, metrics) -> None:
        self.output_processor.metrics = metrics

    # ---- to implement ----

    def _send(self, command) -> None:
        raise NotImplementedError

    def _running(self) -> bool:
        raise NotImplementedError

    # ---- state ----

    @property
    def is_alive(self) -> bool:
        return self.dead_reason is None and self._running()

    def cache_config_info(self) -> dict:
        """The labels of vllm:cache_config_info; num_gpu_blocks once the engine has planned memory."""
        plan = getattr(self, "memory_plan", None)
        blocks = getattr(plan, "num_kv_blocks", None)
        return {**self._cache_config, "num_gpu_blocks": blocks if blocks is not None else ""}

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
        requests = self.processor.process(request_id, prompt_token_ids, params, now)
        if params.structured_outputs is not None:
            await self._init_structured_outputs()
        if self.enable_log_requests:
            logger.info("request %s: %d prompt tokens, %s", request_id, len(prompt_token_ids), params)
        future = self._loop.create_future()
        stream = RequestStream(request_id, self, params.output_kind)
        self.output_processor.add_request(request_id, prompt, prompt_token_ids, params, now)
        self._streams[request_id] = stream
        self._pending[request_id] = future
        self._send(AddCommand(request_id, requests))
        try:
            await future
        except BaseException:
            self._pending.pop(request_id, None)
            self._streams.pop(request_id, None)
            self.output_processor.forget(request_id)  # never served: counts nowhere
            if (not future.done() or future.cancelled()) and self.is_alive:
                # The client left before the engine answered.
                self._send(AbortCommand([r.request_id for r in requests]))
            raise
        return stream

    async def _init_structured_outputs(self) -> None:
        """Send xgrammar's TokenizerInfo once, before the first grammar; it is built in a thread
        (a 128k vocabulary takes a moment) while other requests go on."""
        if self._grammars_init is None:
            async def build_and_send() -> None:
                info = await asyncio.to_thread(self.processor.grammars.tokenizer_info_json)
                self._send(InitStructuredOutputsCommand(info))  # before any add that awaited it

            self._grammars_init = asyncio.ensure_future(build_and_send())
        await asyncio.shield(self._grammars_init)

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self._streams.pop(rid, None)
        _, children = self.output_processor.abort_requests(request_ids, time.monotonic())
        if children and self.is_alive:
            self._send(AbortCommand(children))

    # ---- callbacks, run on the event loop ----

    def _on_message(self, acks: list, outputs: list, stats: dict) -> None:
        """One message of the core loop: add acks, a step's EngineCoreOutputs, the latest stats."""
        self._stats = stats
        for request_id, error in acks:
            future = self._pending.pop(request_id, None)
            if future is None or future.done():
                continue
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)
        if not outputs:
            return
        request_outputs, stopped = self.output_processor.process_outputs(outputs, time.monotonic())
        if stopped and self.is_alive:
            self._send(AbortCommand(stopped))  # stop strings: the core stops them too
        streams = self._streams
        for out in request_outputs:
            stream = streams.get(out.request_id)
            if stream is not None:
                stream.put(out)
                if out.finished:
                    del streams[out.request_id]

    def _on_dead(self, reason: str) -> None:
        first = self.dead_reason is None
        if first:
            self.dead_reason = reason
        self._stats = {**self._stats, **DEAD_GAUGES}
        self._fail_all(EngineDeadError(self.dead_reason))
        if first and not self._stopping:
            logger.error("the engine died: %s", reason)
            for callback in self.on_engine_death:
                callback(reason)

    def _fail_all(self, error: BaseException) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        for stream in self._streams.values():
            stream.put(error)
        for rid in list(self.output_processor.states):
            self.output_processor.forget(rid)
        self._streams.clear()

    def _post(self, callback, *args) -> None:
        """Schedule a callback on the event loop from another thread."""
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: the server is gone
            pass
