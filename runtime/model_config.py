"""ModelConfig: what the engine needs from a checkpoint's config.json, in one place.

It reads the raw JSON (no transformers config classes), so both transformers 4 checkpoints
(rope_theta + rope_scaling) and 5 ones (rope_parameters) load the same way. An image-text
checkpoint is the exception: its language model's fields come from transformers'
get_text_config() (models/text_only.py), and hf_config holds those.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from pagoda.runtime.models.hf_fields import GEMMA_TYPES, has_qkv_bias
from pagoda.runtime.models.text_only import text_config

logger = logging.getLogger(__name__)

_DTYPE_NAMES = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def resolve_model_path(model: str, revision: str | None = None, allow_patterns: list[str] | None = None) -> Path:
    """A local folder as is; otherwise a Hub id (at `revision`), through huggingface_hub's cache."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    patterns = allow_patterns or ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]
    try:
        skip = None
        if not offline:  # Mistral's second copy of the weights is not fetched (download.second_copy)
            from pagoda.runtime.download import second_copy

            planned = snapshot_download(model, revision=revision, allow_patterns=patterns, dry_run=True)
            skip = second_copy([f.filename for f in planned]) or None
        return Path(snapshot_download(model, revision=revision, allow_patterns=patterns, ignore_patterns=skip,
                                      local_files_only=offline))
    except Exception as exc:  # the hub raises many types; all mean the same to the user
        where = "the local Hugging Face cache (HF_HUB_OFFLINE=1)" if offline else "the Hugging Face Hub"
        raise ValueError(
            f"model {model!r} is not a local folder and could not be found in {where}: {exc}"
        ) from exc


@dataclass(slots=True)
class ModelConfig:
    path: Path
    hf_config: dict
    architecture: str
    dtype: str  # "float32", "float16" or "bfloat16"
    max_model_len: int
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    qkv_bias: bool
    tie_word_embeddings: bool
    eos_token_ids: list[int] = field(default_factory=list)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @classmethod
    def from_path(cls, path: Path, dtype: str = "auto", max_model_len: int | None = None) -> ModelConfig:
        cfg = text_config(path, json.loads((path / "config.json").read_text()))
        archs = cfg.get("architectures") or [""]
        heads = cfg["num_attention_heads"]
        rope = dict(cfg.get("rope_parameters") or {})
        scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
        derived = _derive_max_model_len(cfg, max_model_len)
        return cls(
            path=path,
            hf_config=cfg,
            architecture=archs[0],
            dtype=resolve_dtype(dtype, cfg),
            max_model_len=derived,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=scaling,
            qkv_bias=has_qkv_bias(cfg),
            # Gemma ties them unless config.json says otherwise (transformers' default)
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", cfg.get("model_type") in GEMMA_TYPES)),
            eos_token_ids=_generation_eos_ids(path, cfg),
        )


def resolve_dtype(dtype: str, cfg: dict) -> str:
    if dtype == "auto":
        dtype = str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")
    dtype = str(dtype).removeprefix("torch.")
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"dtype must be auto, float32, float16 or bfloat16; got {dtype!r}")
    return _DTYPE_NAMES[dtype]


def _derive_max_model_len(cfg: dict, requested: int | None) -> int:
    limit = cfg.get("max_position_embeddings", 2048)
    if requested is None:
        return limit
    if requested > limit:
        raise ValueError(
            f"max_model_len={requested} is larger than the model allows ({limit}: "
            "max_position_embeddings); lower max_model_len"
        )
    return requested


# generation_config.json keys that become sampling defaults, and their SamplingParams names (vLLM's set).
GENERATION_DEFAULTS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                       "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def generation_defaults(generation_config: str, model_path: Path) -> dict:
    """Sampling defaults from generation_config.json, as vLLM's --generation-config reads them:
    'auto' from the model's folder, 'vllm' none, any other value a folder holding the file. A
    request's own values win over these."""
    if generation_config == "vllm":
        return {}
    folder = Path(model_path) if generation_config == "auto" else Path(generation_config)
    gen = folder / "generation_config.json"
    if not gen.is_file():
        if generation_config != "auto":
            raise ValueError(f"--generation-config {generation_config}: no generation_config.json in that folder")
        return {}
    from transformers import GenerationConfig

    # As vLLM reads it: transformers' diff against its own GenerationConfig() defaults.
    values = GenerationConfig.from_pretrained(folder).to_diff_dict()
    defaults = {ours: values[theirs] for theirs, ours in GENERATION_DEFAULTS.items() if values.get(theirs) is not None}
    if defaults:
        logger.info("sampling defaults from %s: %s (a request's own values win)", gen, defaults)
    return defaults


def _generation_eos_ids(path: Path, cfg: dict) -> list[int]:
    ids = cfg.get("eos_token_id")
    gen = path / "generation_config.json"
    if gen.exists():
        ids = json.loads(gen.read_text()).get("eos_token_id", ids)
    if ids is None:
        return []
    return [ids] if isinstance(ids, int) else list(ids)
