"""Find a checkpoint (local folder or Hub id), build its model, and fill in the weights.

load_format="dummy" fills random weights instead, for benchmarks; it needs only config.json.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.models.registry import get_model_class

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_model_path(model: str, allow_patterns: list[str] | None = None) -> Path:
    """A local folder as is; otherwise a Hub id, through huggingface_hub's cache."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    patterns = allow_patterns or ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]
    try:
        return Path(snapshot_download(model, allow_patterns=patterns, local_files_only=offline))
    except Exception as exc:  # the hub raises many types; all mean the same to the user
        where = "the local Hugging Face cache (HF_HUB_OFFLINE=1)" if offline else "the Hugging Face Hub"
        raise ValueError(
            f"model {model!r} is not a local folder and could not be found in {where}: {exc}"
        ) from exc


def iter_safetensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
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
                yield key, f.get_tensor(key)


def load_model(cfg: ModelConfig, device: torch.device, load_format: str = "auto", seed: int = 0) -> nn.Module:
    model_cls = get_model_class(cfg.architecture)
    dtype = TORCH_DTYPES[cfg.dtype]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_cls(cfg)
    finally:
        torch.set_default_dtype(previous)
    if load_format == "dummy":
        _fill_dummy(model, seed)
    else:
        loaded = model.load_weights(iter_safetensors(cfg.path))
        expected = {n for n, _ in model.named_parameters()}
        if missing := expected - loaded:
            raise ValueError(f"checkpoint in {cfg.path} lacks weights for: {sorted(missing)[:8]}")
    return model.eval()


def _fill_dummy(model: nn.Module, seed: int) -> None:
    # Small values keep activations finite in bf16 through many layers; norms stay at one. Drawn
    # on the parameter's own device, so an 8B dummy model fills in seconds.
    generators: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                param.fill_(1.0)
                continue
            if param.device not in generators:
                generators[param.device] = torch.Generator(device=param.device).manual_seed(seed)
            param.uniform_(-1e-2, 1e-2, generator=generators[param.device])
