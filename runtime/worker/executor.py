"""The engine core's handle on the model: an Executor, local (one process) or tensor-parallel.

The core calls only these methods: the memory arithmetic's inputs (weight_bytes,
profile_peak_activation_bytes), allocate_kv_cache once, then launch per step. The local executor
runs them on its ModelRunner; the tensor-parallel one (worker/distributed/executor.py) runs them
on rank 0's and sends each step to the other ranks. `runner` is rank 0's ModelRunner, for code
that looks inside (tests, GPU scripts).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from pagoda.runtime.core.kv.kv_cache_manager import KVCacheManager
from pagoda.runtime.core.scheduler import SchedulerOutput
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.worker.model_runner import ModelRunner, PendingStep


class Executor(ABC):
    runner: ModelRunner
    # Whether launch() can feed a step's input ids from the previous step's device-side samples
    # (async scheduling).
    supports_ahead: bool = False

    def weight_bytes(self) -> int:
        return self.runner.weight_bytes()  # one rank's shard: the memory plan is per GPU

    @abstractmethod
    def profile_peak_activation_bytes(self, num_tokens: int, max_model_len: int) -> int: ...

    @abstractmethod
    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None: ...

    @abstractmethod
    def launch(self, sched: SchedulerOutput, kv: KVCacheManager, previous: PendingStep | None = None
               ) -> PendingStep: ...

    @abstractmethod
    def shutdown(self) -> None:
        """Stop whatever the executor started (worker processes); idempotent."""


class LocalExecutor(Executor):
    supports_ahead = True

    def __init__(self, runner: ModelRunner):
        self.runner = runner

    def profile_peak_activation_bytes(self, num_tokens: int, max_model_len: int) -> int:
        return self.runner.profile_peak_activation_bytes(num_tokens, max_model_len)

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        self.runner.allocate_kv_cache(num_blocks, block_size)

    def launch(self, sched, kv, previous=None) -> PendingStep:
        return self.runner.launch(sched, kv, previous)

    def shutdown(self) -> None:
        pass  # nothing outside this process


def runner_options(args) -> dict:
    """The ModelRunner keywords that come from EngineArgs (max_num_seqs already resolved)."""
    return dict(load_format=args.load_format, seed=args.seed, max_num_seqs=args.max_num_seqs,
                enforce_eager=args.enforce_eager or args.cudagraph_mode == "NONE",
                mixed_step_graphs=args.cudagraph_mode == "FULL_AND_PIECEWISE",
                max_mixed_graph_tokens=args.max_mixed_graph_tokens, enable_gemv=args.enable_gemv,
                fused_rope_kv=args.fused_rope_kv, enable_pdl=args.enable_pdl, fold_gemv=args.fold_gemv,
                fold_residual=args.fold_residual, gemv_tma=args.gemv_tma, fold_rope_kv=args.fold_rope_kv,
                moe_tile=args.moe_tile, gemm_glu=args.gemm_glu,
                quantization=args.quantization,
                kv_cache_dtype=args.kv_cache_dtype)


def build_executor(cfg: ModelConfig, device: torch.device, args, max_num_batched_tokens: int,
                   pooling_type: str | None = None) -> Executor:
    """pooling_type: LAST, MEAN or CLS for the pooling runner (pooling_config.py), None to generate."""
    from pagoda.runtime.worker.distributed.executor import TensorParallelExecutor, check_tensor_parallel

    tp_size = args.tensor_parallel_size
    check_tensor_parallel(cfg, tp_size, device)
    options = runner_options(args) | {"max_num_batched_tokens": max_num_batched_tokens, "pooling_type": pooling_type}
    if tp_size == 1:
        return LocalExecutor(ModelRunner(cfg, device, **options))
    # Tensor-parallel ranks replay decode graphs only: a mixed step's graphs would have to be
    # captured on every rank around its collectives, which they are not yet.
    del options["mixed_step_graphs"], options["max_mixed_graph_tokens"]
    return TensorParallelExecutor(cfg, device, tp_size, options, args.tp_start_timeout_s)
