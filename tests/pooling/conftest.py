"""Tiny embedding checkpoints and transformers' reference embeddings for them.

Three checkpoints cover how a pooling runner learns its pooling:
- `st_mean`: a Qwen2ForCausalLM with sentence-transformers files (modules.json, 1_Pooling with
  pooling_mode_mean_tokens, a Normalize module): MEAN pooling, normalized;
- `bare_last`: a Llama saved by AutoModel (architecture LlamaModel, no LM head, names without the
  `model.` prefix) and no sentence-transformers files: vLLM's decoder default, LAST, normalized;
- `st_last_raw`: a LlamaForCausalLM whose sentence-transformers files ask for lasttoken pooling
  and list no Normalize module: LAST, not normalized (as vLLM reads such a checkpoint).
The reference is AutoModel's last_hidden_state (after the final norm) in float32, pooled and
normalized here with torch.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch

from pagoda.runtime.tools.tiny_models import build_tiny_model, write_sentence_transformers


def build_bare_model(path: Path, family: str = "llama", **config) -> Path:
    """A tiny model saved by AutoModel: architecture LlamaModel, no LM head."""
    from transformers import AutoModel, AutoTokenizer

    causal = build_tiny_model(path.with_name(path.name + "-causal"), family, seed=3)
    model = AutoModel.from_pretrained(causal, dtype=torch.float32)
    for key, value in config.items():
        setattr(model.config, key, value)
    model.save_pretrained(path, safe_serialization=True)
    AutoTokenizer.from_pretrained(causal).save_pretrained(path)
    shutil.copy(causal / "tiny_model.json", path / "tiny_model.json")
    return path


@pytest.fixture(scope="session")
def st_mean(tmp_path_factory) -> str:
    path = build_tiny_model(tmp_path_factory.mktemp("st_mean") / "qwen2", "qwen2", seed=1)
    write_sentence_transformers(path, "mean_tokens", normalize=True)
    return str(path)


@pytest.fixture(scope="session")
def bare_last(tmp_path_factory) -> str:
    return str(build_bare_model(tmp_path_factory.mktemp("bare_last") / "llama"))


@pytest.fixture(scope="session")
def st_last_raw(tmp_path_factory) -> str:
    path = build_tiny_model(tmp_path_factory.mktemp("st_last_raw") / "llama", "llama", seed=2)
    write_sentence_transformers(path, "lasttoken", normalize=False)
    return str(path)


def make_inputs(lengths, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 512) for _ in range(n)] for n in lengths]


class HFEmbeddings:
    """AutoModel's final hidden states in float32, pooled as the engine should pool them."""

    def __init__(self):
        self.models: dict[str, object] = {}

    def hidden(self, path: str, ids: list[int]) -> torch.Tensor:
        if path not in self.models:
            from transformers import AutoModel

            self.models[path] = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            return self.models[path](torch.tensor([ids])).last_hidden_state[0]

    def embed(self, path: str, ids: list[int], pooling: str, normalize: bool = True) -> torch.Tensor:
        h = self.hidden(path, ids)
        vector = {"LAST": h[-1], "MEAN": h.mean(0), "CLS": h[0]}[pooling]
        return torch.nn.functional.normalize(vector, dim=-1) if normalize else vector


@pytest.fixture(scope="session")
def hf_embed() -> HFEmbeddings:
    return HFEmbeddings()


@pytest.fixture(scope="session")
def tiny_causal(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("causal") / "llama", "llama")
