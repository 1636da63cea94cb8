"""architectures[0] picks the model class; an unknown one is refused, naming the supported set,
both by the engine and by `pagoda plan`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from pagoda.runtime import LLM
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.models import SUPPORTED_ARCHITECTURES, get_model_class
from pagoda.runtime.plan import make_plan
from pagoda.runtime.tools.tiny_models import FAMILIES
from pagoda.runtime.worker.model_loader import iter_safetensors, load_model

FAMILY_ARCHS = {"Qwen3ForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM", "Gemma2ForCausalLM",
                "Gemma3ForCausalLM", "Phi3ForCausalLM"}


def test_supported_set_names_the_new_families():
    assert FAMILY_ARCHS <= set(SUPPORTED_ARCHITECTURES)


def test_unknown_architecture_is_refused_with_the_supported_list(tiny_models, tmp_path):
    path = tmp_path / "unknown"
    shutil.copytree(tiny_models["llama"], path)
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["FalconMambaForCausalLM"]
    (path / "config.json").write_text(json.dumps(config))
    for build in (lambda: LLM(str(path), device="cpu", max_model_len=64), lambda: make_plan(str(path), 80)):
        with pytest.raises(ValueError) as err:
            build()
        message = str(err.value)
        assert "'FalconMambaForCausalLM' is not supported" in message
        assert all(arch in message for arch in SUPPORTED_ARCHITECTURES)


@pytest.mark.parametrize("family", FAMILIES)
def test_dummy_shapes_are_the_checkpoint_shapes_transformers_writes(tiny_models, family):
    """load_format=dummy draws tensors in checkpoint_shapes; they must be exactly the tensors of a
    real checkpoint of the family, so a dummy benchmark model is the model that would be served."""
    path = Path(tiny_models[family])
    cfg = ModelConfig.from_path(path)
    written = {name: tuple(t.get_shape()) for name, t in iter_safetensors(path, lazy=True)}
    if cfg.tie_word_embeddings:
        written.pop("lm_head.weight", None)
    assert dict(get_model_class(cfg.architecture).checkpoint_shapes(cfg)) == written
    load_model(cfg, torch.device("cpu"), "dummy")  # every parameter is filled


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "gemma2"])
def test_transformers_in_memory_weights_load_as_the_checkpoint_does(tiny_models, hf, family):
    """transformers 5 holds experts stacked ([E, 2 * inter, hidden]) where its checkpoints hold one
    tensor per expert; the GPU correctness script copies the in-memory state dict, so both load."""
    path = tiny_models[family]
    cfg = ModelConfig.from_path(Path(path))
    from_checkpoint = load_model(cfg, torch.device("cpu"))
    from_memory = load_model(cfg, torch.device("cpu"), "dummy", seed=5)
    with torch.no_grad():
        from_memory.load_weights(hf.model(path).state_dict().items())
    mine = dict(from_memory.named_parameters())
    for name, param in from_checkpoint.named_parameters():
        torch.testing.assert_close(mine[name], param, rtol=0, atol=0, msg=name)
