"""The thread engine client: the engine core's loop runs in a thread of the server's process.

    event loop (HTTP)                            engine thread
    add_request ── AddCommand ──> inbox (SimpleQueue) ──> run_core_loop: apply, step
    abort       ── AbortCommand ─>                           │
    OutputProcessor <── loop.call_soon_threadsafe(_on_message, acks, outputs, stats) ┘

The engine thread owns the EngineCore: no other thread touches it, so it needs no lock. It only
steps; detokenization, stop strings and outputs happen on the event loop. It shares the GIL with
the HTTP side, so under heavy streaming the step loop waits on Python work it does not own;
`--engine-mode process` (frontend/process_engine.py) moves it out. This mode starts faster and
lets tests reach into the core object.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading

from pagoda.runtime.core.core_loop import StopCommand, run_core_loop, stats_dict
from pagoda.runtime.frontend.engine_client import EngineClient, EngineDeadError

logger = logging.getLogger("pagoda.server")


class _ThreadTransport:
    """The core loop's transport in a thread: an inbox, and callbacks posted to the event loop."""

    def __init__(self, client: AsyncEngine):
        self.client = client
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()

    def receive(self, block: bool) -> list:
        commands = [self.inbox.get()] if block else []  # idle: sleep until there is work
        while True:
            try:
                commands.append(self.inbox.get_nowait())
            except queue.Empty:
                return commands

    def send(self, message: tuple) -> None:
        _, acks, outputs, stats = message
        self.client._post(self.client._on_message, acks, outputs, stats)


class AsyncEngine(EngineClient):
    def __init__(self, engine_args, core, tokenizer, max_queue_len: int | None = None):
        super().__init__(engine_args, core.model_config, tokenizer, stats_dict(core), max_queue_len)
        self.engine = core
        self.memory_plan = core.memory_plan
        self._transport = _ThreadTransport(self)
        self._thread: threading.Thread | None = None

    @classmethod
    def from_engine_args(cls, engine_args, **kwargs) -> AsyncEngine:
        from pagoda.runtime.core.engine_core import EngineCore
        from pagoda.runtime.frontend.tokenizer import load_tokenizer
        from pagoda.runtime.model_config import resolve_model_path

        core = EngineCore(engine_args)
        source = engine_args.tokenizer or engine_args.model
        tokenizer = load_tokenizer(resolve_model_path(source, engine_args.revision), engine_args.chat_template)
        return cls(engine_args, core, tokenizer, **kwargs)

    # ---- lifecycle (event loop side) ----

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="pagoda-engine", daemon=True)
        self._thread.start()

    async def shutdown(self, timeout: float = 30.0) -> None:
        self._stopping = True
        if self._thread is not None and self._thread.is_alive():
            self._transport.inbox.put(StopCommand())
            await asyncio.to_thread(self._thread.join, timeout)
        self._fail_all(EngineDeadError("the server is shutting down"))
        self.dead_reason = self.dead_reason or "the server is shutting down"

    def _running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _send(self, command) -> None:
        self._transport.inbox.put(command)

    def _run(self) -> None:
        try:
            run_core_loop(self.engine, self._transport)
            self._post(self._on_dead, "the server is shutting down")
        except BaseException as exc:  # noqa: BLE001 - any failure takes the engine down
            logger.exception("engine loop failed")
            self._post(self._on_dead, f"engine error: {type(exc).__name__}: {exc}")
