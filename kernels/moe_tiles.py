"""Measured fused-MoE tiles per GPU and layer shape, as vLLM keeps its fused_moe configs.

moe_tiles.json maps a GPU's name (torch.cuda.get_device_name) and a layer shape
("E=128,H=2048,I=768,bf16": experts, hidden, this rank's inter, weight dtype) to the best tile that
e2e/moe_gpu_sweep.py measured at each token count. A batch takes the tile of the nearest measured
count; a shape or GPU never swept falls back to fused_moe.default_config's first guesses.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

TILES_FILE = Path(__file__).with_name("moe_tiles.json")
TILE_KEYS = ("block_m", "block_n", "block_k", "num_warps", "num_stages")


def shape_key(num_experts: int, hidden: int, inter: int, weight_dtype: torch.dtype) -> str:
    return f"E={num_experts},H={hidden},I={inter},{str(weight_dtype).removeprefix('torch.')}"


@functools.cache
def _table() -> dict:
    return json.loads(TILES_FILE.read_text()) if TILES_FILE.exists() else {}


@functools.cache
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def tuned_tile(num_tokens: int, num_experts: int, hidden: int, inter: int, weight_dtype: torch.dtype,
               device: torch.device) -> dict | None:
    """The measured tile nearest num_tokens, or None where nothing was measured."""
    if device.type != "cuda":
        return None
    by_tokens = _table().get(_device_name(device.index or 0), {}).get(
        shape_key(num_experts, hidden, inter, weight_dtype))
    if not by_tokens:
        return None
    nearest = min(by_tokens, key=lambda t: abs(int(t) - num_tokens))
    return dict(zip(TILE_KEYS, by_tokens[nearest]))
