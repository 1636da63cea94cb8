"""The engine core process: `python -m pagoda.runtime.core.engine_proc FD`.

The server (server/process_engine.py) starts it with one end of a socketpair as FD. Messages are
pickled, framed by multiprocessing's Connection:

    server -> engine   (EngineArgs, log_level)              once, first
                       [AddCommand | AbortCommand | StopCommand, ...]   batches of commands
    engine -> server   ("ready", EngineInfo) | ("failed", reason)        once, after loading
                       ("step", acks, deltas, stats)        after applying commands (acks), and
                                                            after each step (deltas)
                       ("dead", reason)                     the step loop failed; the process exits

The process owns the LLMEngine and nothing else: tokenizing, chat templates, HTTP and SSE stay in
the server, so the step loop holds this process's GIL alone. Between steps it drains every
command that arrived, so adds and aborts cost one poll, and it sends each step's new tokens as one
message of deltas (server/engine_deltas.py). It ignores SIGINT (the server shuts it down in order)
and exits when the server's end of the socket closes, so it never outlives the server.
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

from pagoda.runtime.frontend.engine_client import apply_commands, stats_dict
from pagoda.runtime.frontend.engine_deltas import DeltaEncoder

logger = logging.getLogger("pagoda.engine_proc")

PROTOCOL = pickle.HIGHEST_PROTOCOL


@dataclass(slots=True)
class EngineInfo:
    """What the server needs to know of the engine it did not build itself."""

    max_model_len: int
    vocab_size: int | None
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


def serve(engine, conn: Connection) -> int:
    """The step loop. Returns the exit code."""
    encoder = DeltaEncoder()
    while True:
        commands = []
        if not engine.has_unfinished_requests():
            commands.extend(recv(conn))  # idle: sleep until there is work
        while conn.poll():
            commands.extend(recv(conn))
        if commands:
            # Answered before the step, as the thread client does: the server sets up the
            # responses while the engine computes their first tokens.
            acks, stop = apply_commands(engine, commands)
            acks = [(rid, None if err is None else portable_error(err)) for rid, err in acks]
            send(conn, ("step", acks, [], stats_dict(engine.stats())))
            if stop:
                return 0
        if engine.has_unfinished_requests():
            deltas = encoder.encode(engine.step())
            if deltas:
                send(conn, ("step", [], deltas, stats_dict(engine.stats())))


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(int(argv[0]))
    try:
        engine_args, log_level = recv(conn)
    except EOFError:
        return 1
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        from pagoda.runtime.core.engine import LLMEngine

        engine = LLMEngine.from_engine_args(engine_args)
    except BaseException as exc:  # noqa: BLE001 - reported to the server, which refuses to start
        logger.exception("the engine failed to load")
        send(conn, ("failed", f"{type(exc).__name__}: {exc}"))
        return 1
    info = EngineInfo(engine.model_config.max_model_len, getattr(engine.model_config, "vocab_size", None),
                      getattr(engine, "memory_plan", None), stats_dict(engine.stats()))
    # Everything built so far (the model, the tokenizer, CUDA graphs) lives as long as the process.
    # Frozen, the collector stops walking it: under full load its full collections took 1.2 s of
    # a 16 s W3 run, on the step loop's thread (vLLM's engine core freezes its heap likewise).
    gc.collect()
    gc.freeze()
    send(conn, ("ready", info))
    try:
        return serve(engine, conn)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return 0  # the server is gone
    except BaseException as exc:  # noqa: BLE001 - any failure takes the engine down
        logger.exception("engine loop failed")
        try:
            send(conn, ("dead", f"engine error: {type(exc).__name__}: {exc}"))
        except OSError:
            pass
        return 1


if __name__ == "__main__":
    # Run the copy imported under the package name, so that what it pickles (EngineInfo) names
    # pagoda.runtime.core.engine_proc, not __main__, and unpickles in the server.
    from pagoda.runtime.core import engine_proc

    sys.exit(engine_proc.main(sys.argv[1:]))
