"""Start the worker processes and the process group: NCCL on CUDA, gloo on the CPU.

Rank 0 (the engine process) opens a TCPStore on a free local port and starts ranks 1..N-1 as
`python -m pagoda.runtime.worker.distributed.worker`, each with a pipe on its stdin for the steps. Every
wait polls the workers, so one that dies at start-up is an error at once, never a hang; and a
worker ends by itself when its pipe closes or rank 0 dies, so none outlives the engine.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from pagoda.runtime.layers.parallel_state import TensorParallelGroup

logger = logging.getLogger(__name__)

COLLECTIVE_TIMEOUT = timedelta(minutes=30)
HOST = "127.0.0.1"


@dataclass(slots=True)
class WorkerSpec:
    """What a worker needs to build the same ModelRunner as rank 0 (sent as JSON on its argv)."""

    model_path: str
    dtype: str
    max_model_len: int
    device_type: str  # "cuda" or "cpu"
    load_format: str
    seed: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enforce_eager: bool
    world_size: int
    enable_gemv: bool = True
    fused_rope_kv: bool = True
    enable_pdl: bool = True
    fold_gemv: bool = True
    fold_residual: bool = False
    gemv_tma: bool = False
    fold_rope_kv: bool = True
    moe_tile: str | None = None
    gemm_glu: bool = False
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    start_timeout_s: float = 1800.0  # a 70B load is slow
    store_port: int = 0
    num_threads: int = 1
    pooling_type: str | None = None  # the pooling runner's models have no LM head


def runner_options(spec: WorkerSpec) -> dict:
    """The ModelRunner keywords every rank builds its runner with."""
    return dict(load_format=spec.load_format, seed=spec.seed, max_num_seqs=spec.max_num_seqs,
                max_num_batched_tokens=spec.max_num_batched_tokens, enforce_eager=spec.enforce_eager,
                enable_gemv=spec.enable_gemv, fused_rope_kv=spec.fused_rope_kv,
                enable_pdl=spec.enable_pdl, fold_gemv=spec.fold_gemv,
                fold_residual=spec.fold_residual, gemv_tma=spec.gemv_tma, fold_rope_kv=spec.fold_rope_kv,
                moe_tile=spec.moe_tile, gemm_glu=spec.gemm_glu,
                pooling_type=spec.pooling_type,
                quantization=spec.quantization, kv_cache_dtype=spec.kv_cache_dtype)


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def rank_device(device_type: str, rank: int) -> torch.device:
    if device_type == "cuda":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


def join_group(rank: int, world_size: int, store: dist.Store, device_type: str) -> TensorParallelGroup:
    store.set(f"joined/{rank}", "1")
    dist.init_process_group(
        backend_for(device_type), store=store, rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT
    )
    return TensorParallelGroup(rank=rank, size=world_size, group=dist.group.WORLD)


class Workers:
    """Ranks 1..N-1 as child processes, the store they meet at, and their step pipes."""

    def __init__(self, spec: WorkerSpec):
        if dist.is_initialized():
            # The ranks meet in torch's default process group, of which a process has one.
            raise RuntimeError(
                "a tensor-parallel engine is already running in this process; shut it down first "
                "(LLM.shutdown() or LLMEngine.shutdown())"
            )
        self.spec = spec
        self.store = dist.TCPStore(
            HOST, 0, spec.world_size, is_master=True, wait_for_workers=False,
            timeout=timedelta(seconds=spec.start_timeout_s),
        )  # fmt: skip
        spec.store_port = self.store.port
        cores = os.cpu_count() or 1
        spec.num_threads = max(1, cores // spec.world_size)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pagoda.runtime.worker.distributed.worker",
                    str(rank),
                    json.dumps(asdict(spec)),
                ],
                stdin=subprocess.PIPE,
                env=env,
            )
            for rank in range(1, spec.world_size)
        ]
        self.group: TensorParallelGroup | None = None

    @property
    def pipes(self):
        return [p.stdin for p in self.procs]

    def _wait_keys(self, prefix: str, what: str) -> None:
        deadline = time.monotonic() + self.spec.start_timeout_s
        pending = set(range(1, self.spec.world_size))
        while pending:
            for rank in sorted(pending):
                if self.store.check([f"{prefix}/{rank}"]):
                    status = self.store.get(f"{prefix}/{rank}").decode()
                    if status != "1":
                        raise RuntimeError(f"tensor-parallel worker {rank} failed while {what}:\n{status}")
                    pending.discard(rank)
                    continue
                code = self.procs[rank - 1].poll()
                if code is not None:
                    raise RuntimeError(
                        f"tensor-parallel worker {rank} exited with code {code} while {what}; see its log above"
                    )
            if pending and time.monotonic() > deadline:
                raise TimeoutError(
                    f"tensor-parallel workers {sorted(pending)} did not finish {what} within "
                    f"{self.spec.start_timeout_s:.0f} s (--tp-start-timeout)"
                )
            if pending:
                time.sleep(0.02)

    def init_rank0(self) -> TensorParallelGroup:
        self._wait_keys("joined", "joining the process group")
        self.group = join_group(0, self.spec.world_size, self.store, self.spec.device_type)
        return self.group

    def wait_ready(self) -> None:
        """Block until every worker has built its model (or raise with the first failure)."""
        self._wait_keys("ready", "loading the model")

    def shutdown(self, timeout: float = 10.0) -> None:
        """Close the pipes (each worker then leaves its loop), wait, and kill any that linger."""
        for proc in self.procs:
            try:
                proc.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("tensor-parallel worker pid %d did not exit; killing it", proc.pid)
                proc.kill()
                proc.wait()
        if self.group is not None and dist.is_initialized():
            dist.destroy_process_group()
        self.group = None
