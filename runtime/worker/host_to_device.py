"""Host lists to device tensors without waiting for the GPU."""

from __future__ import annotations

import torch


def tensor_on(device: torch.device, values: list, dtype: torch.dtype) -> torch.Tensor:
    """A tensor on `device` from host lists, without waiting for the GPU. A plain
    `torch.tensor(values, device=cuda)` (or indexing a CUDA tensor with a list) is a blocking copy,
    which waits for every step in flight; pinned memory, which the caching host allocator keeps
    until the copy has run, lets it queue behind them instead."""
    tensor = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        tensor = tensor.pin_memory().to(device, non_blocking=True)
    return tensor


def index_on(device: torch.device, values: list) -> torch.Tensor:
    """An int64 index tensor on `device` (see tensor_on)."""
    return tensor_on(device, values, torch.long)
