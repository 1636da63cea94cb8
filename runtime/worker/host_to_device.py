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


def positions_in(items: list, within: list) -> list[int]:
    """Where each of `items` sits in `within`, by identity (KeyError if one is not there): the
    rows of a step's requests among the previous step's. Those are the previous rows less the
    requests that finished, in order, so one walk along `within` finds them (a third of the
    time of a dict of every row, W4's ~1,000 of them, when requests finish); other orders take
    the dict."""
    rows, candidates = [], enumerate(within)
    for x in items:
        for j, y in candidates:
            if y is x:
                rows.append(j)
                break
        else:
            break  # not found after the last match: not in order
    else:
        return rows
    where = {id(y): j for j, y in enumerate(within)}
    return [where[id(x)] for x in items]
