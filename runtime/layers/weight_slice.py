"""Read a rank's slice of a checkpoint tensor, from a loaded tensor or a lazy safetensors slice.

The loader hands weight loaders safetensors' `get_slice` handles, so a rank reads from disk only
the rows or columns it keeps: at tensor-parallel size N each rank reads about 1/N of the weights.
Plain tensors (dummy weights, tests, the GPU correctness script) go through the same calls.
"""

from __future__ import annotations

import torch


def shape_of(loaded) -> tuple[int, ...]:
    return tuple(loaded.shape) if isinstance(loaded, torch.Tensor) else tuple(loaded.get_shape())


def narrow(loaded, dim: int, start: int, length: int) -> torch.Tensor:
    """loaded[..., start:start+length, ...] along dim, reading nothing else from a lazy slice."""
    if isinstance(loaded, torch.Tensor):
        return loaded.narrow(dim, start, length)
    index = (slice(None),) * dim + (slice(start, start + length),)
    return loaded[index]


def materialize(loaded) -> torch.Tensor:
    """The whole tensor (replicated parameters: norms, biases of row-parallel layers)."""
    if isinstance(loaded, torch.Tensor):
        return loaded
    return loaded[(slice(None),) * len(shape_of(loaded))] if shape_of(loaded) else loaded[...]


def is_fp8(loaded) -> bool:
    """Whether a checkpoint tensor (or lazy slice) holds float8_e4m3fn values."""
    if isinstance(loaded, torch.Tensor):
        return loaded.dtype == torch.float8_e4m3fn
    return loaded.get_dtype() == "F8_E4M3"
