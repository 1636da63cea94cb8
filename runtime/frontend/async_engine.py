"""The thread engine client: LLMEngine's step loop runs in a thread of the server's process.

    event loop (HTTP)                             engine thread
    add_request ── AddCommand ──> inbox (SimpleQueue) ──> engine.add_request, ack ─┐
    abort       ── AbortCommand ─>                    ──> engine.abort_request     │
    RequestStream <── loop.call_soon_threadsafe(_on_step, outputs, stats) <────────┴─ engine.step()

The engine thread owns the LLMEngine: no other thread touches it, so it needs no lock. One
call_soon_threadsafe per step carries every output of that step. It shares the GIL with the HTTP
side, so under heavy streaming the step loop waits on Python work it does not own; `--engine-mode
process` (server/process_engine.py) moves it out. This mode starts faster and lets tests reach into
the engine object.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time

from pagoda.runtime.frontend.engine_client import (
    AbortCommand,
    AddCommand,
    EngineClient,
    EngineDeadError,
    RequestStream,
    StopCommand,
    apply_commands,
    stats_dict,
)

__all__ = ["AbortCommand", "AddCommand", "AsyncEngine", "EngineDeadError", "RequestStream"]

logger = logging.getLogger("pagoda.server")


class AsyncEngine(EngineClient):
    def __init__(self, engine, metrics=None, max_queue_len: int | None = None):
        super().__init__(metrics, max_queue_len, stats_dict(engine.stats()))
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.max_model_len: int = engine.model_config.max_model_len
        self.vocab_size = getattr(engine.model_config, "vocab_size", None)
        self.memory_plan = getattr(engine, "memory_plan", None)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_engine_args(cls, engine_args, **kwargs) -> AsyncEngine:
        from pagoda.runtime.core.engine import LLMEngine

        return cls(LLMEngine.from_engine_args(engine_args), **kwargs)

    # ---- lifecycle (event loop side) ----

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="pagoda-engine", daemon=True)
        self._thread.start()

    async def shutdown(self, timeout: float = 30.0) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._inbox.put(StopCommand())
            await asyncio.to_thread(self._thread.join, timeout)
        self._fail_all(EngineDeadError("the server is shutting down"))
        self.dead_reason = self.dead_reason or "the server is shutting down"

    def _running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _send(self, command) -> None:
        self._inbox.put(command)

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
                if commands:
                    acks, stop = apply_commands(engine, commands)
                    self._post(self._on_acks, acks, stats_dict(engine.stats()))
                    if stop:
                        self._post(self._on_dead, "the server is shutting down")
                        return
                if engine.has_unfinished_requests():
                    outputs = engine.step()
                    self._post(self._on_step, outputs, stats_dict(engine.stats()), time.monotonic())
        except BaseException as exc:  # noqa: BLE001 - any failure takes the engine down
            logger.exception("engine loop failed")
            self._post(self._on_dead, f"engine error: {type(exc).__name__}: {exc}")
