"""The engine's handle on the model: a ModelRunner at world size 1, a TensorParallelExecutor above.

The executor is rank 0's side of tensor parallelism. It builds rank 0's shard of the model in a
ModelRunner and stands in for that runner in the engine (the same weight_bytes, profiling,
allocate_kv_cache and launch/execute calls), so the engine's step loop does not change. Calls that hold
collectives are sent to the workers first; each step's staged inputs go to them from inside
rank 0's own batch build, before its forward pass starts.
"""

from __future__ import annotations

import logging
import weakref

import torch

from pagoda.runtime.layers.parallel_state import check_head_split, tensor_parallel
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.worker.distributed.channel import StepMessage, StepSender, layout_fields
from pagoda.runtime.worker.distributed.launch import Workers, WorkerSpec
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


def build_executor(cfg: ModelConfig, device: torch.device, args, max_num_batched_tokens: int):
    """The object the engine runs its model through (see the module docstring)."""
    tp_size = args.tensor_parallel_size
    check_tensor_parallel(cfg, tp_size, device)
    kwargs = dict(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enforce_eager=args.enforce_eager,
    )
    if tp_size == 1:
        return ModelRunner(cfg, device, args.load_format, args.seed, **kwargs)
    spec = WorkerSpec(
        model_path=str(cfg.path), dtype=cfg.dtype, max_model_len=cfg.max_model_len, device_type=device.type,
        load_format=args.load_format, seed=args.seed, world_size=tp_size, **kwargs,
    )  # fmt: skip
    return TensorParallelExecutor(cfg, device, spec)


class _BroadcastingBuilder:
    """Rank 0's BatchBuilder, plus: once it has staged a step, send the stage to every worker."""

    def __init__(self, builder, buffers, sender: StepSender):
        self.inner, self.buffers, self.sender = builder, buffers, sender
        self.layout = None
        send = buffers.send

        def send_and_keep(layout) -> None:
            self.layout = layout
            send(layout)

        buffers.send = send_and_keep  # the one seam that sees the StageLayout of the step

    def build(self, sched, kv, pad_seqs: int | None) -> StepBatch:
        batch = self.inner.build(sched, kv, pad_seqs)
        layout, b = self.layout, self.buffers
        self.sender.send_step(
            StepMessage(
                pad_seqs=pad_seqs or 0,
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
        return batch

    def __getattr__(self, name):
        return getattr(self.inner, name)


class TensorParallelExecutor:
    # Workers read input ids from the staged host arrays, so a step cannot be fed from rank 0's
    # device-side samples: the engine schedules synchronously under tensor parallelism.
    supports_ahead = False

    def __init__(self, cfg: ModelConfig, device: torch.device, spec: WorkerSpec):
        self.tp_size = spec.world_size
        self.workers = Workers(spec)
        # Stops the workers when the engine is dropped or the interpreter exits, whatever happens.
        self._finalizer = weakref.finalize(self, self.workers.shutdown)
        try:
            self.tp = self.workers.init_rank0()
            with tensor_parallel(self.tp):
                self.runner = ModelRunner(
                    cfg,
                    device,
                    spec.load_format,
                    spec.seed,
                    max_num_seqs=spec.max_num_seqs,
                    max_num_batched_tokens=spec.max_num_batched_tokens,
                    enforce_eager=spec.enforce_eager,
                )
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

    def weight_bytes(self) -> int:
        return self.runner.weight_bytes()  # this rank's shard: the memory plan is per GPU

    def profile_peak_activation_bytes(self, num_tokens: int, max_model_len: int) -> int:
        return self._mirror("profile_peak_activation_bytes", num_tokens, max_model_len)

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        # Same block count on every rank: block tables from rank 0 index every rank's shard.
        self._mirror("allocate_kv_cache", num_blocks, block_size)
        self.runner.builder = _BroadcastingBuilder(self.runner.builder, self.runner.buffers, self.sender)

    def launch(self, sched, kv):
        return self.runner.launch(sched, kv)

    def execute(self, sched, kv):
        return self.runner.execute(sched, kv)

    def shutdown(self) -> None:
        self._finalizer()

    def __getattr__(self, name):
        # Anything else (model, kv_cache, buffers, graphs) is rank 0's runner's.
        if name == "runner":
            raise AttributeError(name)
        return getattr(self.runner, name)
