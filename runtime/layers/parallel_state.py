"""Tensor-parallel rank and size. One process, one GPU today; NCCL groups plug in here later."""

from __future__ import annotations

import torch


def get_tp_rank() -> int:
    return 0


def get_tp_size() -> int:
    return 1


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    if get_tp_size() == 1:
        return x
    torch.distributed.all_reduce(x)
    return x


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    if get_tp_size() == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(get_tp_size())]
    torch.distributed.all_gather(parts, x)
    return torch.cat(parts, dim=-1)


def divide(numerator: int, denominator: int) -> int:
    if numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by the tensor-parallel size {denominator}")
    return numerator // denominator
