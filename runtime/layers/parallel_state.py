"""Tensor-parallel rank, size and process group, and the two collectives the model needs.

Layers read the group once, when they are built (`tensor_parallel` sets it around model
construction, as `attention_context` does around a forward), and keep it. So a world-size-1 model
and a sharded one can live in the same process, and the forward pass reads no global state.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, slots=True)
class TensorParallelGroup:
    rank: int = 0
    size: int = 1
    group: Any = None  # a torch.distributed ProcessGroup (NCCL on CUDA, gloo on the CPU) when size > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum partial results in place across ranks (row-parallel outputs, the vocab embedding)."""
        if self.size > 1:
            torch.distributed.all_reduce(x, group=self.group)
        return x

    def gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's slice along the last dim on rank 0; other ranks get their own
        slice back, unused. Only rank 0 samples, so a gather (each slice to one rank) is enough
        where an all-gather would send every slice to every rank."""
        if self.size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)] if self.rank == 0 else None
        torch.distributed.gather(x, parts, dst=0, group=self.group)
        return torch.cat(parts, dim=-1) if parts is not None else x


_SINGLE = TensorParallelGroup()
_current: TensorParallelGroup = _SINGLE


def current_tp() -> TensorParallelGroup:
    return _current


def get_tp_size() -> int:
    return _current.size


@contextmanager
def tensor_parallel(tp: TensorParallelGroup) -> Iterator[TensorParallelGroup]:
    """Build a model inside this block to shard it over `tp`."""
    global _current
    previous, _current = _current, tp
    try:
        yield tp
    finally:
        _current = previous


def divide(numerator: int, denominator: int) -> int:
    if numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by the tensor-parallel size {denominator}")
    return numerator // denominator


def kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    """KV heads each rank holds: a share of them, or one replica when there are fewer than ranks."""
    return max(1, num_kv_heads // tp_size)


def check_head_split(num_heads: int, num_kv_heads: int, tp_size: int) -> None:
    """Raise a ValueError naming the numbers when the heads cannot be split over tp_size ranks."""
    if tp_size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {tp_size}")
    if num_heads % tp_size:
        raise ValueError(
            f"tensor_parallel_size={tp_size} does not divide the model's {num_heads} attention heads; "
            f"use a size that divides {num_heads}"
        )
    if num_kv_heads % tp_size and tp_size % num_kv_heads:
        raise ValueError(
            f"tensor_parallel_size={tp_size} and the model's {num_kv_heads} KV heads do not fit: "
            f"the size must divide the KV heads, or be a multiple of them (KV heads are then replicated)"
        )
