"""A tensor-parallel worker (rank 1..N-1): build this rank's model shard, then mirror rank 0.

`python -m pagoda.runtime.worker.distributed.worker RANK SPEC_JSON`, started by launch.py. The loop reads
the step pipe: a call runs the same ModelRunner method rank 0 runs (memory profiling, KV-cache
allocation, CUDA-graph capture: each holds collectives, so every rank must make it); a step
writes rank 0's staged inputs into this rank's buffers and runs the same forward and the same
LM-head rows, whose collectives pair with rank 0's. The worker never samples.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from pagoda.runtime.layers.parallel_state import tensor_parallel
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.worker.distributed.channel import StepMessage, StepReceiver
from pagoda.runtime.worker.distributed.launch import HOST, WorkerSpec, join_group, rank_device, runner_options
from pagoda.runtime.worker.input_batch import StageLayout
from pagoda.runtime.worker.model_runner import ModelRunner

logger = logging.getLogger("pagoda.tp_worker")


def _exit_with_parent() -> None:
    """A worker whose engine process died (even by SIGKILL, mid-collective) exits too."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class Worker:
    def __init__(self, rank: int, spec: WorkerSpec):
        self.rank = rank
        torch.set_num_threads(spec.num_threads)
        self.device = rank_device(spec.device_type, rank)
        self.store = dist.TCPStore(
            HOST,
            spec.store_port,
            spec.world_size,
            is_master=False,
            timeout=timedelta(seconds=spec.start_timeout_s),
        )
        self.tp = join_group(rank, spec.world_size, self.store, spec.device_type)
        self.spec = spec
        self.runner: ModelRunner | None = None

    def build(self) -> None:
        spec = self.spec
        cfg = ModelConfig.from_path(Path(spec.model_path), spec.dtype, spec.max_model_len)
        with tensor_parallel(self.tp):
            self.runner = ModelRunner(cfg, self.device, **runner_options(spec))

    @torch.inference_mode()
    def step(self, msg: StepMessage) -> None:
        runner = self.runner
        b = runner.buffers
        layout = StageLayout(*msg.layout)
        b.next_stage()[: layout.end] = msg.stage
        b.send(layout)
        if msg.pad_seqs:
            hidden = runner.graphs.run(msg.pad_seqs)
        else:
            hidden = runner.forward_eager(msg.num_tokens, msg.num_seqs, msg.max_query_len, msg.max_seq_len,
                                          msg.num_decode_seqs)
        # The same LM-head calls as rank 0's ModelRunner.launch, in the same order: each one
        # gathers this rank's vocabulary slice onto rank 0.
        if msg.num_sample:
            rows = (
                hidden[: msg.num_seqs] if msg.sample_all_rows else hidden[b.logits_indices[: msg.num_sample]]
            )
            runner.model.compute_logits(rows)
        for row, count in msg.prompt_rows:
            runner.model.compute_logits(hidden[row : row + count])

    def serve(self, receiver: StepReceiver) -> None:
        while (msg := receiver.recv()) is not None:
            if isinstance(msg, StepMessage):
                self.step(msg)
            else:
                method, args = msg
                getattr(self.runner, method)(*args)


def main(argv: list[str]) -> int:
    rank, spec = int(argv[0]), WorkerSpec(**json.loads(argv[1]))
    logging.basicConfig(level=logging.WARNING, format=f"[tp rank {rank}] %(levelname)s %(name)s: %(message)s")
    _exit_with_parent()
    worker = Worker(rank, spec)
    try:
        worker.build()
    except BaseException:
        worker.store.set(f"ready/{rank}", traceback.format_exc())
        raise
    worker.store.set(f"ready/{rank}", "1")
    receiver = StepReceiver(sys.stdin.fileno())
    try:
        worker.serve(receiver)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
