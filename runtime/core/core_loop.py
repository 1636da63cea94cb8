"""The engine core's loop, the same in a thread of the server and in the engine process.

    frontend ── [AddCommand | AbortCommand | InitStructuredOutputsCommand | StopCommand, ...]
                                                               ──> transport.receive()
                                                                     apply_commands, core.step()
    frontend <── ("step", acks, outputs, stats) ─────────────────── transport.send()

Between steps the loop drains every command that arrived, so adds and aborts cost one poll; it
answers adds before the step (the frontend sets up the responses while the core computes their
first tokens), then sends each step's EngineCoreOutputs in one message. Idle, it sleeps in
receive() until there is work. The transport is a queue and the event loop for the thread mode
(frontend/async_engine.py), and a socket for the process mode (core/engine_proc.py).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Protocol

from pagoda.runtime.core.engine_core import EngineCore, EngineCoreRequest

logger = logging.getLogger("pagoda.engine_core")


@dataclass(slots=True)
class AddCommand:
    request_id: str  # the user's request id, which the ack names
    requests: list[EngineCoreRequest]  # its children (one unless n > 1)


@dataclass(slots=True)
class AbortCommand:
    request_ids: list[str]  # core request ids (children)


@dataclass(slots=True)
class InitStructuredOutputsCommand:
    tokenizer_info_json: str  # xgrammar's TokenizerInfo, sent once before the first grammar


class StopCommand:
    """Ask the loop to return; picklable, so it crosses to the engine process too."""


class Transport(Protocol):
    def receive(self, block: bool) -> list: ...

    def send(self, message: tuple) -> None: ...


def run_core_loop(core: EngineCore, transport: Transport) -> int:
    """Serve commands and step until a StopCommand. Returns the exit code."""
    while True:
        commands = transport.receive(block=not core.has_unfinished_requests())
        if commands:
            acks, stop = apply_commands(core, commands)
            # Sent even without acks: the frontend's gauges must see an abort's freed blocks.
            transport.send(("step", acks, [], stats_dict(core)))
            if stop:
                return 0
        if core.has_unfinished_requests():
            outputs = core.step()
            if outputs:
                transport.send(("step", [], outputs, stats_dict(core)))


def apply_commands(core: EngineCore, commands: list) -> tuple[list[tuple[str, BaseException | None]], bool]:
    """Apply adds and aborts in order; returns the adds' acks and whether a stop was asked."""
    acks, stop = [], False
    for cmd in commands:
        if isinstance(cmd, StopCommand):
            stop = True
        elif isinstance(cmd, InitStructuredOutputsCommand):
            core.init_structured_outputs(cmd.tokenizer_info_json)
        elif isinstance(cmd, AddCommand):
            added = []
            try:
                for request in cmd.requests:
                    core.add_request(request)
                    added.append(request.request_id)
                acks.append((cmd.request_id, None))
            except Exception as exc:  # a bad request must not take the others down
                acks.append((cmd.request_id, exc))
                core.abort_requests(added)
        else:
            core.abort_requests(cmd.request_ids)
    return acks, stop


def stats_dict(core: EngineCore) -> dict:
    return asdict(core.stats())
