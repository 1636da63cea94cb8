"""The step pipe: rank 0 sends each step's flat int32 inputs to every worker over its stdin.

A step is what rank 0's BatchBuilder already staged for its own host-to-device copy (token ids,
positions, slot_mapping, seq_lens, query_start_loc, logits rows, block tables) plus a few scalars,
so a worker rebuilds exactly the same device buffers without a scheduler, requests or KV manager.
That is a few KiB per step, written to N-1 pipes: tens of microseconds, no pickling, and no
collective to time out while the server is idle. A closed pipe (rank 0 gone) ends the worker.
"""

from __future__ import annotations

import os
import pickle
import struct
from dataclasses import dataclass, fields
from typing import IO

import numpy as np

HEADER = struct.Struct("<16q")  # kind, payload bytes, then the kind's scalars
KIND_STEP, KIND_CALL = 1, 2


@dataclass(slots=True)
class StepMessage:
    pad_seqs: int  # >0: a decode step padded to this CUDA-graph bucket; 0: eager
    num_tokens: int
    num_seqs: int
    max_query_len: int
    max_seq_len: int
    num_decode_seqs: int  # the leading one-token sequences of a mixed step
    num_sample: int  # rows whose logits rank 0 computes for sampling
    sample_all_rows: bool  # those rows are exactly 0..num_seqs-1 (else logits_indices)
    layout: tuple[int, ...]  # StageLayout's fields, to rebuild it on the worker
    prompt_rows: list[tuple[int, int]]  # (first hidden row, row count) per prompt-logprobs request
    stage: np.ndarray  # int32, the host staging array's used prefix

    SCALARS = ("pad_seqs", "num_tokens", "num_seqs", "max_query_len", "max_seq_len", "num_decode_seqs",
               "num_sample", "sample_all_rows")  # fmt: skip


def layout_fields(layout) -> tuple[int, ...]:
    return tuple(int(getattr(layout, f.name)) for f in fields(layout))


class StepSender:
    """Rank 0's end: one pipe per worker."""

    def __init__(self, pipes: list[IO[bytes]]):
        self.pipes = pipes

    def _send(self, kind: int, scalars: list[int], payload: bytes | memoryview) -> None:
        header = HEADER.pack(kind, len(payload), *scalars, *[0] * (14 - len(scalars)))
        try:
            for pipe in self.pipes:
                pipe.write(header)
                pipe.write(payload)
                pipe.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise RuntimeError("a tensor-parallel worker has exited; see its log above") from exc

    def send_step(self, msg: StepMessage) -> None:
        ints = np.concatenate([
            np.asarray(msg.layout, dtype=np.int32),
            np.asarray(msg.prompt_rows, dtype=np.int32).reshape(-1),
            msg.stage.astype(np.int32, copy=False),
        ])  # fmt: skip
        scalars = [int(getattr(msg, name)) for name in StepMessage.SCALARS]
        self._send(KIND_STEP, [*scalars, len(msg.layout), len(msg.prompt_rows)], memoryview(ints).cast("B"))

    def send_call(self, method: str, *args) -> None:
        self._send(KIND_CALL, [], pickle.dumps((method, args)))


class StepReceiver:
    """A worker's end: reads its stdin (or any fd) until rank 0 closes it."""

    def __init__(self, fd: int = 0):
        self.fd = fd

    def _read(self, n: int) -> bytes | None:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            chunk = os.readv(self.fd, [view[got:]])
            if chunk == 0:
                return None
            got += chunk
        return bytes(buf)

    def recv(self) -> StepMessage | tuple[str, tuple] | None:
        """The next step or (method, args) call; None once rank 0 has closed the pipe."""
        header = self._read(HEADER.size)
        if header is None:
            return None
        kind, size, *scalars = HEADER.unpack(header)
        payload = self._read(size) if size else b""
        if payload is None:
            return None
        if kind == KIND_CALL:
            return pickle.loads(payload)
        n_scalars = len(StepMessage.SCALARS)
        values = dict(zip(StepMessage.SCALARS, scalars[:n_scalars]))
        num_layout, num_prompt = scalars[n_scalars], scalars[n_scalars + 1]
        ints = np.frombuffer(payload, dtype=np.int32)
        rows = ints[num_layout : num_layout + 2 * num_prompt].reshape(-1, 2)
        return StepMessage(
            **values,
            layout=tuple(int(v) for v in ints[:num_layout]),
            prompt_rows=[(int(r), int(n)) for r, n in rows],
            stage=ints[num_layout + 2 * num_prompt :],
        )
