"""The process engine client: the engine core steps in a child process (core/engine_proc.py).

    event loop (HTTP)                    server threads                 engine process
    add_request / abort ── outbox ──> writer: one pickled batch ──socket──> drain, apply, step
    OutputProcessor <── _on_message <── reader: unpickle, post <──socket── ("step", acks, outputs, stats)

With the engine in a thread, every SSE chunk the server writes holds the GIL the step loop needs:
at full load hundreds of streams cost the engine a quarter of its throughput. Here the server's
process does the HTTP work and the frontend's (detokenization, stop strings, outputs), and the
engine's process only steps. Everything above the engine client is the same in both modes.

The two threads keep the event loop off the socket: the writer may block while the engine is deep
in a step and its receive buffer is full, and the reader blocks waiting for the next step.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection

from pagoda.runtime.core.core_loop import StopCommand
from pagoda.runtime.core.engine_proc import EngineInfo, recv, send
from pagoda.runtime.frontend.engine_client import EngineClient, EngineDeadError

logger = logging.getLogger("pagoda.server")


class EngineStartError(RuntimeError):
    """The engine process could not load the model; the server must not start."""


def launch_engine_process(engine_args, log_level: str = "info", timeout: float | None = None
                          ) -> tuple[subprocess.Popen, Connection, EngineInfo]:
    """Start the engine process and wait until it has loaded the model (or failed to)."""
    ours, theirs = socket.socketpair()
    # OpenMP workers that spin between parallel regions take cores from the server process, and on
    # a busy host every barrier then waits for a descheduled spinner (measured: 10x slower steps on
    # 2 shared cores). The GPU path barely uses OpenMP, so sleeping workers cost it nothing.
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    with theirs:
        proc = subprocess.Popen([sys.executable, "-m", "pagoda.runtime.core.engine_proc", str(theirs.fileno())],
                                pass_fds=(theirs.fileno(),), env=env)
    conn = Connection(ours.detach())
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        send(conn, (engine_args, log_level))
        while not conn.poll(1.0):
            if deadline is not None and time.monotonic() > deadline:
                raise EngineStartError(f"the engine process did not load the model within {timeout:.0f}s")
        try:
            kind, payload = recv(conn)
        except (EOFError, OSError):
            code = proc.wait(timeout=10)
            raise EngineStartError(f"the engine process exited with code {code} while loading the model "
                                   "(its log is above)") from None
        if kind != "ready":
            raise EngineStartError(f"the engine failed to load the model: {payload}")
    except BaseException:
        conn.close()
        _stop(proc, timeout=5.0)  # a failed load exits by itself; one still loading is killed
        raise
    return proc, conn, payload


def _stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class ProcessEngine(EngineClient):
    def __init__(self, engine_args, proc: subprocess.Popen, conn: Connection, info: EngineInfo, model_config,
                 tokenizer, max_queue_len: int | None = None):
        super().__init__(engine_args, model_config, tokenizer, info.stats, max_queue_len)
        self.proc = proc
        self.memory_plan = info.memory_plan
        self._conn = conn
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    @classmethod
    def from_engine_args(cls, engine_args, log_level: str | None = None, **kwargs) -> ProcessEngine:
        from pagoda.runtime.frontend.tokenizer import load_tokenizer
        from pagoda.runtime.model_config import ModelConfig, resolve_model_path

        if log_level is None:
            log_level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
        proc, conn, info = launch_engine_process(engine_args, log_level)
        try:
            # After the engine loaded: a Hub model is in the local cache by now.
            path = resolve_model_path(engine_args.model, engine_args.revision)
            model_config = ModelConfig.from_path(path, engine_args.dtype, engine_args.max_model_len)
            source = resolve_model_path(engine_args.tokenizer, engine_args.revision) if engine_args.tokenizer \
                else path
            tokenizer = load_tokenizer(source, engine_args.chat_template)
        except BaseException:
            conn.close()
            _stop(proc)
            raise
        return cls(engine_args, proc, conn, info, model_config, tokenizer, **kwargs)

    # ---- lifecycle (event loop side) ----

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._threads = [threading.Thread(target=self._write, name="pagoda-engine-writer", daemon=True),
                         threading.Thread(target=self._read, name="pagoda-engine-reader", daemon=True)]
        for t in self._threads:
            t.start()

    async def shutdown(self, timeout: float = 30.0) -> None:
        self._stopping = True
        if self.proc.poll() is None:
            self._outbox.put(StopCommand())
            await asyncio.to_thread(_stop, self.proc, timeout)
        self._outbox.put(None)  # ends the writer
        for t in self._threads:
            await asyncio.to_thread(t.join, timeout)
        self._conn.close()
        self._fail_all(EngineDeadError("the server is shutting down"))
        self.dead_reason = self.dead_reason or "the server is shutting down"

    def _running(self) -> bool:
        return bool(self._threads) and self.proc.poll() is None

    def _send(self, command) -> None:
        self._outbox.put(command)

    # ---- server threads ----

    def _write(self) -> None:
        outbox, conn = self._outbox, self._conn
        while True:
            batch = [outbox.get()]
            while True:  # everything queued meanwhile goes in the same message
                try:
                    batch.append(outbox.get_nowait())
                except queue.Empty:
                    break
            done = None in batch
            batch = [c for c in batch if c is not None]
            try:
                if batch:
                    send(conn, batch)
            except OSError:
                return  # the engine process is gone; the reader reports it
            if done:
                return

    def _read(self) -> None:
        conn = self._conn
        while True:
            try:
                message = recv(conn)
            except (EOFError, OSError):
                break
            if message[0] == "step":
                self._post(self._on_message, *message[1:])
            elif message[0] == "dead":
                self._post(self._on_dead, message[1])
        if not self._stopping:
            try:
                code = self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                code = None
            logger.error("the engine process exited (code %s)", code)
            self._post(self._on_dead, f"the engine process exited unexpectedly (code {code})")
