"""Find a checkpoint (local folder or Hub id), build its model, and fill in the weights.

load_format="dummy" fills random weights instead, for benchmarks; it needs only config.json.
Under tensor parallelism (the model is built inside `tensor_parallel`), each rank reads only its
shard: the weight loaders take lazy safetensors slices and read the rows or columns they keep.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.models.pooling_adapter import as_pooling_model, pooling_weights
from pagoda.runtime.models.registry import get_model_class
from pagoda.runtime.models.text_only import TextWeights, is_text_only

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """--kv-cache-dtype: auto is the model's dtype; fp8 (vLLM's name for e4m3) and fp8_e4m3 one byte."""
    return model_dtype if kv_cache_dtype == "auto" else torch.float8_e4m3fn


def iter_safetensors(path: Path, lazy: bool = False,
                     rename: Callable[[str], str | None] | None = None) -> Iterator[tuple[str, object]]:
    """(name, tensor) for every checkpoint tensor; with lazy=True, (name, safetensors slice), from
    which a weight loader reads just the part it needs (see layers/weight_slice.py). rename gives
    each name the model's, or None for a tensor to skip unread (an image-text checkpoint's vision
    tower, models/text_only.py)."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {path}; Pagoda loads safetensors checkpoints only")
    from tqdm.auto import tqdm

    # One bar over the shards: an 8B checkpoint takes long enough that the user should see it move.
    # Quiet when stderr is not a terminal (tests, Kubernetes logs keep the start-up log line).
    for name in tqdm(files, desc="Loading safetensors shards", unit="shard", disable=None):
        with safe_open(path / name, framework="pt") as f:
            for key in f.keys():
                ours = rename(key) if rename else key
                if ours is not None:
                    yield ours, (f.get_slice(key) if lazy else f.get_tensor(key))


def load_model(cfg: ModelConfig, device: torch.device, load_format: str = "auto", seed: int = 0,
               pooling: bool = False, quantization: str | None = None) -> nn.Module:
    """pooling: for the pooling runner, without the LM head (models/pooling_adapter.py).
    quantization: --quantization (fp8 quantizes a bf16 checkpoint at load); an FP8 checkpoint's
    own quantization_config is read either way (pagoda.runtime.quantization)."""
    from pagoda.runtime.quantization import apply as fp8
    from pagoda.runtime.quantization.scheme import resolve_scheme

    scheme = resolve_scheme(cfg.hf_config, quantization)  # an unsupported scheme fails here, first
    if scheme is not None and scheme.serialized and load_format == "dummy":
        raise ValueError(f"load_format dummy cannot fill an FP8 checkpoint ({scheme.source}); use a bf16 config "
                         "with --quantization fp8")
    model_cls = get_model_class(cfg.architecture)
    dtype = TORCH_DTYPES[cfg.dtype]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_cls(cfg)
            if scheme is not None:
                fp8.prepare(model, scheme)
    finally:
        torch.set_default_dtype(previous)
    text_weights = TextWeights(cfg.architecture) if is_text_only(cfg.architecture) else None
    if load_format == "dummy":
        weights = dummy_weights(model_cls.checkpoint_shapes(cfg), dtype, device, seed)
        where = "dummy weights"
    else:
        weights = iter_safetensors(cfg.path, lazy=True, rename=text_weights)
        where = f"checkpoint in {cfg.path}"
    if pooling:
        model, weights = as_pooling_model(model), pooling_weights(weights)
    with torch.no_grad():
        loaded = model.load_weights(weights)
    if text_weights is not None and load_format != "dummy":
        text_weights.log()
    expected = {n for n, _ in model.named_parameters()}
    if missing := expected - loaded:
        raise ValueError(f"{where} lacks weights for: {sorted(missing)[:8]}")
    if scheme is not None:
        with torch.no_grad():
            fp8.finish(model, scheme, dtype)
    return model.eval()


def dummy_weights(
    shapes: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype, device: torch.device, seed: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """Random checkpoint-shaped tensors, one at a time, drawn in a fixed order from one generator:
    every rank draws the same full tensors and keeps its shard, so a model with dummy weights is
    the same model at any tensor-parallel size. Small values keep activations finite in bf16
    through many layers; norms stay at one. Drawn on the device, so an 8B model fills in seconds."""
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, shape in shapes:
        tensor = torch.empty(shape, dtype=dtype, device=device)
        if name.endswith("norm.weight") or "layernorm" in name:
            yield name, tensor.fill_(1.0)
        else:
            yield name, tensor.uniform_(-1e-2, 1e-2, generator=generator)
