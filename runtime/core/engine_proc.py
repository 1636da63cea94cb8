"""The engine core process: `python -m pagoda.runtime.core.engine_proc FD`.

The server (frontend/process_engine.py) starts it with one end of a socketpair as FD. Messages are
pickled, framed by multiprocessing's Connection:

    server -> engine   (EngineArgs, log_level)              once, first
                       [AddCommand | AbortCommand | StopCommand, ...]   batches of commands
    engine -> server   ("ready", EngineInfo) | ("failed", reason)        once, after loading
                       ("step", acks, outputs, stats)       after applying commands (acks), and
                                                            after each step (EngineCoreOutputs)
                       ("dead", reason)                     the step loop failed; the process exits

The process owns the EngineCore and nothing else: it holds no tokenizer, and tokenizing, chat
templates, detokenization, stop strings, HTTP and SSE stay in the server, so the step loop holds
this process's GIL alone. It runs the same loop as the thread mode (core/core_loop.py) over a
socket. It ignores SIGINT (the server shuts it down in order) and exits when the server's end of
the socket closes, so it never outlives the server.
"""

from __future__ import annotations

import gc
import logging
import pickle
import signal
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

logger = logging.getLogger("pagoda.engine_proc")

PROTOCOL = pickle.HIGHEST_PROTOCOL


@dataclass(slots=True)
class EngineInfo:
    """What the server needs to know of the engine it did not build itself."""

    max_model_len: int
    memory_plan: Any
    stats: dict


def send(conn: Connection, message) -> None:
    conn.send_bytes(pickle.dumps(message, PROTOCOL))


def recv(conn: Connection):
    return pickle.loads(conn.recv_bytes())


def portable_error(exc: BaseException) -> BaseException:
    """An add's error as the server should raise it: ValueErrors stay (they become 400s), and
    anything else is named, in case its class does not unpickle on the other side."""
    if isinstance(exc, ValueError):
        return ValueError(str(exc))
    return RuntimeError(f"{type(exc).__name__}: {exc}")


class SocketTransport:
    """The core loop's transport in the engine process."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def receive(self, block: bool) -> list:
        commands = []
        if block:
            commands.extend(recv(self.conn))  # idle: sleep until there is work
        while self.conn.poll():
            commands.extend(recv(self.conn))
        return commands

    def send(self, message: tuple) -> None:
        kind, acks, outputs, stats = message
        if acks:
            acks = [(rid, None if err is None else portable_error(err)) for rid, err in acks]
        send(self.conn, (kind, acks, outputs, stats))


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(int(argv[0]))
    try:
        engine_args, log_level = recv(conn)
    except EOFError:
        return 1
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        from pagoda.runtime.core.core_loop import run_core_loop, stats_dict
        from pagoda.runtime.core.engine_core import EngineCore

        core = EngineCore(engine_args)
    except BaseException as exc:  # noqa: BLE001 - reported to the server, which refuses to start
        logger.exception("the engine failed to load")
        send(conn, ("failed", f"{type(exc).__name__}: {exc}"))
        return 1
    info = EngineInfo(core.model_config.max_model_len, core.memory_plan, stats_dict(core))
    # Everything built so far (the model, CUDA graphs) lives as long as the process. Frozen, the
    # collector stops walking it: under full load its full collections took 1.2 s of a 16 s W3
    # run, on the step loop's thread (vLLM's engine core freezes its heap likewise).
    gc.collect()
    gc.freeze()
    send(conn, ("ready", info))
    try:
        return run_core_loop(core, SocketTransport(conn))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return 0  # the server is gone
    except BaseException as exc:  # noqa: BLE001 - any failure takes the engine down
        logger.exception("engine loop failed")
        try:
            send(conn, ("dead", f"engine error: {type(exc).__name__}: {exc}"))
        except OSError:
            pass
        return 1
    finally:
        core.shutdown()


if __name__ == "__main__":
    # Run the copy imported under the package name, so that what it pickles (EngineInfo) names
    # pagoda.runtime.core.engine_proc, not __main__, and unpickles in the server.
    from pagoda.runtime.core import engine_proc

    sys.exit(engine_proc.main(sys.argv[1:]))
