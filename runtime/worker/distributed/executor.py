"""TensorParallelExecutor: rank 0's side of tensor parallelism, behind the Executor interface.

It builds rank 0's shard of the model in a ModelRunner and starts the other ranks' processes.
Calls that hold collectives (profiling, KV-cache allocation with graph capture) are sent to the
workers first, then run here; each step's staged inputs go to them through the runner's on_staged
hook, after rank 0 staged them and before its forward pass starts.
"""

from __future__ import annotations

import logging
import weakref

import torch

from pagoda.runtime.layers.parallel_state import check_head_split, tensor_parallel
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.worker.distributed.channel import StepMessage, StepSender, layout_fields
from pagoda.runtime.worker.distributed.launch import Workers, WorkerSpec, runner_options
from pagoda.runtime.worker.executor import Executor
from pagoda.runtime.worker.input_batch import StepBatch
from pagoda.runtime.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def check_tensor_parallel(
    cfg: ModelConfig, tp_size: int, device: torch.device, num_gpus: int | None = None
) -> None:
    """Raise a ValueError, with the numbers, for a tensor-parallel size this model or host cannot run."""
    check_head_split(cfg.num_heads, cfg.num_kv_heads, tp_size)
    if tp_size == 1:
        return
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"tensor_parallel_size={tp_size} needs device cuda or cpu, not {device.type!r}")
    if device.type == "cuda":
        if device.index not in (None, 0):
            raise ValueError(
                f"with tensor_parallel_size={tp_size} rank r runs on cuda:r; pick the GPUs with "
                f"CUDA_VISIBLE_DEVICES instead of device={device}"
            )
        num_gpus = torch.cuda.device_count() if num_gpus is None else num_gpus
        if tp_size > num_gpus:
            raise ValueError(
                f"tensor_parallel_size={tp_size} needs {tp_size} GPUs, but {num_gpus} "
                f"{'is' if num_gpus == 1 else 'are'} visible on this host"
            )


class TensorParallelExecutor(Executor):
    # Workers read input ids from the staged host arrays, so a step cannot be fed from rank 0's
    # device-side samples: the engine schedules synchronously under tensor parallelism.
    supports_ahead = False

    def __init__(self, cfg: ModelConfig, device: torch.device, tp_size: int, options: dict,
                 start_timeout_s: float = 1800.0):
        self.tp_size = tp_size
        spec = WorkerSpec(
            model_path=str(cfg.path), dtype=cfg.dtype, max_model_len=cfg.max_model_len, device_type=device.type,
            world_size=tp_size, start_timeout_s=start_timeout_s, **options,
        )  # fmt: skip
        self.workers = Workers(spec)
        # Stops the workers when the engine is dropped or the interpreter exits, whatever happens.
        self._finalizer = weakref.finalize(self, self.workers.shutdown)
        try:
            self.tp = self.workers.init_rank0()
            with tensor_parallel(self.tp):
                self.runner = ModelRunner(cfg, device, **runner_options(spec))
            self.workers.wait_ready()
        except BaseException:
            self.shutdown()
            raise
        self.sender = StepSender(self.workers.pipes)
        logger.info(
            "tensor parallel: %d ranks (%s), workers %s",
            self.tp_size,
            device.type,
            [p.pid for p in self.workers.procs],
        )

    def _mirror(self, method: str, *args):
        self.sender.send_call(method, *args)
        return getattr(self.runner, method)(*args)

    def profile_peak_activation_bytes(self, num_tokens: int, max_model_len: int) -> int:
        return self._mirror("profile_peak_activation_bytes", num_tokens, max_model_len)

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        # Same block count on every rank: block tables from rank 0 index every rank's shard.
        self._mirror("allocate_kv_cache", num_blocks, block_size)
        self.runner.on_staged = self._send_step

    def _send_step(self, batch: StepBatch) -> None:
        """Every worker gets rank 0's staged inputs, and runs the same forward on its shard."""
        layout, b = batch.layout, self.runner.buffers
        self.sender.send_step(
            StepMessage(
                pad_seqs=batch.pad_seqs,
                num_tokens=batch.num_tokens,
                num_seqs=batch.num_seqs,
                max_query_len=batch.max_query_len,
                max_seq_len=batch.max_seq_len,
                num_decode_seqs=batch.num_decode_seqs,
                num_sample=len(batch.sample_requests),
                sample_all_rows=batch.sample_all_rows,
                layout=layout_fields(layout),
                prompt_rows=[(row, last - first) for _, row, first, last in batch.prompt_rows],
                stage=b.host_stages[b.turn].numpy()[: layout.end],
            )
        )

    def launch(self, sched, kv, previous=None):
        return self.runner.launch(sched, kv)

    def shutdown(self) -> None:
        self._finalizer()
