"""The other image-text architectures served text only (models/text_only.py), each against its own
transformers class on input_ids alone: Mistral3ForConditionalGeneration (Mistral Small 3.1/3.2:
a Mistral language model, head_dim not hidden / heads, untied, beside a Pixtral tower), and
Qwen2_5_VLForConditionalGeneration and Qwen2VLForConditionalGeneration (a Qwen2 language model,
qkv bias, with multimodal RoPE, served by the engine's 1-D RoPE: see the logits test).

For each: the checkpoint is an image-text one, the config is the text model's, both tensor layouts
(the one transformers writes, and the other, built by renaming) give exactly the text model's
tensors with the vision ones skipped unread, greedy tokens equal transformers' generate (with
preemption, and with chunked prefill), and teacher-forced logits agree to 1e-4 in fp32."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.models import get_model_class
from pagoda.runtime.models.text_only import TextWeights
from pagoda.runtime.tools.tiny_models import build_tiny_model
from pagoda.runtime.worker.model_loader import iter_safetensors, load_model

from .test_logits_parity import ATOL, DECODE_STEPS, PHASES, engine_logits
from .test_text_only_vlm import (
    WatchedOpen,
    assert_greedy_matches,
    checkpoint_names,
    greedy_reference,
    relayout,
)


def renamer(*pairs: tuple[str, str]):
    def rename(name: str) -> str:
        for old, new in pairs:
            if name.startswith(old):
                return new + name[len(old):]
        return name
    return rename


@dataclass(frozen=True)
class Family:
    tiny: str  # the tiny_models family
    architecture: str
    hf_class: str
    text_model_type: str
    written: str  # the leading name of a text layer in what transformers writes
    vision: tuple[str, ...]  # the vision tower's and projector's prefixes, in either layout
    to_other: object  # written layout -> the other one


FAMILIES = {
    "mistral3": Family(
        "mistral3_vlm", "Mistral3ForConditionalGeneration", "Mistral3ForConditionalGeneration", "mistral",
        written="language_model.model.layers.",
        vision=("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector."),
        to_other=renamer(("language_model.model.", "model.language_model."), ("language_model.lm_head.", "lm_head."),
                         ("vision_tower.", "model.vision_tower."),
                         ("multi_modal_projector.", "model.multi_modal_projector."))),
    "qwen2_5_vl": Family(
        "qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
        "qwen2_5_vl_text", written="model.layers.", vision=("visual.", "model.visual."),
        to_other=renamer(("model.", "model.language_model."), ("visual.", "model.visual."))),
    "qwen2_vl": Family(
        "qwen2_vl", "Qwen2VLForConditionalGeneration", "Qwen2VLForConditionalGeneration", "qwen2_vl_text",
        written="model.layers.", vision=("visual.", "model.visual."),
        to_other=renamer(("model.", "model.language_model."), ("visual.", "model.visual."))),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request) -> Family:
    return FAMILIES[request.param]


@pytest.fixture(scope="module")
def vlm(family, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp(family.tiny)
    written = build_tiny_model(root / "written", family.tiny)
    names = checkpoint_names(written)
    assert any(n.startswith(family.written) for n in names), f"transformers wrote {names[:4]}: teach this test"
    return {"written": written, "other": relayout(written, root / "other", family.to_other)}


@pytest.fixture(scope="module")
def hf_vlm(family, vlm):
    import transformers

    cls = getattr(transformers, family.hf_class)
    return cls.from_pretrained(vlm["written"], dtype=torch.float32).eval()


def test_the_checkpoint_is_an_image_text_one(family, vlm):
    for path in vlm.values():
        config = json.loads((path / "config.json").read_text())
        assert config["architectures"] == [family.architecture] and "vision_config" in config
        assert any(n.startswith(family.vision) for n in checkpoint_names(path))


def test_config_is_the_text_models(family, vlm, hf_vlm):
    cfg = ModelConfig.from_path(vlm["written"])
    text = hf_vlm.config.get_text_config()
    assert cfg.architecture == family.architecture and cfg.hf_config["model_type"] == family.text_model_type
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (
        text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads,
        getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads, text.vocab_size)
    tied = hf_vlm.lm_head.weight.data_ptr() == hf_vlm.get_input_embeddings().weight.data_ptr()
    assert cfg.tie_word_embeddings == tied and cfg.dtype == "float32"


def test_the_renamed_text_tensors_are_exactly_the_models(vlm):
    """Every tensor outside the vision tower and projector gets a name in the text model's class,
    with the shape load_format=dummy draws: nothing of the text model is left unread."""
    for path in vlm.values():
        cfg = ModelConfig.from_path(path)
        rename, ours = TextWeights(cfg.architecture), {}
        for name, tensor in iter_safetensors(path, lazy=True):
            if (new := rename(name)) is not None:
                ours[new] = tuple(tensor.get_shape())
        if cfg.tie_word_embeddings:
            ours.pop("lm_head.weight", None)
        assert dict(get_model_class(cfg.architecture).checkpoint_shapes(cfg)) == ours
        assert rename.skipped > 0


def test_both_layouts_load_the_same_weights_and_skip_vision_unread(family, vlm, monkeypatch):
    import safetensors

    models = {}
    for layout, path in vlm.items():
        opened: list[str] = []
        monkeypatch.setattr(safetensors, "safe_open", WatchedOpen(safetensors.safe_open, opened))
        models[layout] = load_model(ModelConfig.from_path(path), torch.device("cpu"))
        monkeypatch.undo()
        assert opened and not [k for k in opened if k.startswith(family.vision)], layout
    old, new = (dict(m.named_parameters()) for m in models.values())
    assert old.keys() == new.keys()
    for name, param in old.items():
        torch.testing.assert_close(new[name], param, rtol=0, atol=0, msg=name)


SETUPS = {"written": dict(num_kv_blocks=18),  # 16 prompts cannot all hold their blocks: preemption
          "other": dict(max_num_batched_tokens=12)}  # chunked prefill


@pytest.fixture(scope="module")
def hf_greedy(hf_vlm):
    return greedy_reference(hf_vlm)


@pytest.mark.parametrize("layout", list(SETUPS))
def test_greedy_matches_transformers_generate(vlm, hf_greedy, layout):
    assert_greedy_matches(vlm[layout], SETUPS[layout], hf_greedy)


def test_teacher_forced_logits_match_transformers(vlm, hf_vlm):
    """For Qwen2-VL and Qwen2.5-VL this is the check that multimodal RoPE on text alone is the
    engine's 1-D RoPE: transformers gives text tokens three equal position components (temporal,
    height, width), so every mrope_section turns by the same position. The sections are live: the
    height and width components set apart from the temporal one give other logits."""
    rng = random.Random(11)
    total = [sum(phase[s] for phase in (PHASES["prefill"], PHASES["extend"])) + DECODE_STEPS for s in range(2)]
    seqs = [[rng.randrange(5, 512) for _ in range(n)] for n in total]
    got = engine_logits(str(vlm["written"]), seqs)
    mrope = hf_vlm.config.get_text_config().rope_parameters.get("mrope_section")
    for s, seq in enumerate(seqs):
        with torch.no_grad():
            want = hf_vlm(input_ids=torch.tensor([seq])).logits[0].float()
        assert got[s].shape == want.shape
        assert (got[s] - want).abs().max() <= ATOL
        if mrope:
            t = torch.arange(len(seq))
            with torch.no_grad():  # (a shift common to every token would cancel: RoPE is relative)
                equal = hf_vlm(input_ids=torch.tensor([seq]), position_ids=torch.stack([t, t, t])[:, None])
                moved = hf_vlm(input_ids=torch.tensor([seq]), position_ids=torch.stack([t, 2 * t, t // 2])[:, None])
            equal, moved = equal.logits[0].float(), moved.logits[0].float()
            assert (got[s] - equal).abs().max() <= ATOL
            assert (got[s] - moved).abs().max() > 100 * ATOL


def test_a_stored_lm_head_is_not_tied_to_a_default_tie(tmp_path):
    """transformers 5 writes Mistral3Config's default tie_word_embeddings (true) at the top level of
    a checkpoint whose LM head is its own; it then keeps that head untied, and so does Pagoda."""
    import shutil

    from transformers import Mistral3ForConditionalGeneration

    path = build_tiny_model(tmp_path / "written", "mistral3_vlm")
    config = json.loads((path / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (path / "config.json").write_text(json.dumps(config))
    hf = Mistral3ForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
    assert hf.lm_head.weight.data_ptr() != hf.get_input_embeddings().weight.data_ptr()
    assert not ModelConfig.from_path(path).tie_word_embeddings
    single = relayout(path, tmp_path / "one_file", lambda name: name)  # the headers, not the index
    assert not ModelConfig.from_path(single).tie_word_embeddings
    (tmp_path / "plan").mkdir()  # a config.json alone (pagoda plan): the config's word
    shutil.copy(path / "config.json", tmp_path / "plan" / "config.json")
    assert ModelConfig.from_path(tmp_path / "plan").tie_word_embeddings
