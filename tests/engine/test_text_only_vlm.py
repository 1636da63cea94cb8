"""Gemma3ForConditionalGeneration (gemma-3-4b-it and up), served text only: config from text_config,
the language model's tensors under either prefix, the vision tower skipped unread, and greedy
tokens and logits as transformers' own Gemma3ForConditionalGeneration gives them for text."""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.models import get_model_class
from pagoda.runtime.models.text_only import TextWeights
from pagoda.runtime.tools.tiny_models import build_tiny_model
from pagoda.runtime.worker.model_loader import iter_safetensors, load_model

from .conftest import MAX_NEW_TOKENS, make_prompts
from .test_logits_parity import ATOL, DECODE_STEPS, PHASES, engine_logits

ARCH = "Gemma3ForConditionalGeneration"
VISION = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


def checkpoint_names(path: Path) -> list[str]:
    names = []
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(file, "pt") as f:
            names += list(f.keys())
    return names


def relayout(src: Path, dst: Path, rename) -> Path:
    """A copy of src whose tensors are renamed, in one unsharded file (the other layout)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "model.safetensors.index.json"))
    tensors = {}
    for file in sorted(src.glob("*.safetensors")):
        with safe_open(file, "pt") as f:
            tensors |= {rename(k): f.get_tensor(k) for k in f.keys()}
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def to_transformers5(name: str) -> str:
    """transformers 5's in-memory names (model.language_model., model.vision_tower., ...)."""
    for old, new in (("language_model.model.", "model.language_model."), ("vision_tower.", "model.vision_tower."),
                     ("multi_modal_projector.", "model.multi_modal_projector.")):
        if name.startswith(old):
            return new + name[len(old):]
    return name


@pytest.fixture(scope="module")
def vlm(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vlm")
    written = build_tiny_model(root / "gemma3_vlm", "gemma3_vlm")
    names = checkpoint_names(written)
    # transformers 5.2x saves the layout Google published; the other is built by renaming
    layout = "transformers4" if any(n.startswith("language_model.model.") for n in names) else "transformers5"
    other = "transformers5" if layout == "transformers4" else "transformers4"
    rename = to_transformers5 if other == "transformers5" else None
    assert rename is not None, f"transformers wrote {names[:3]}: teach this test the reverse rename"
    return {layout: written, other: relayout(written, root / other, rename)}


@pytest.fixture(scope="module")
def hf_vlm(vlm):
    from transformers import Gemma3ForConditionalGeneration

    return Gemma3ForConditionalGeneration.from_pretrained(vlm["transformers4"], dtype=torch.float32).eval()


def test_the_checkpoint_is_an_image_text_one(vlm):
    for path in vlm.values():
        config = json.loads((path / "config.json").read_text())
        assert config["architectures"] == [ARCH] and "vision_config" in config and "text_config" in config
        assert any(n.startswith(VISION) for n in checkpoint_names(path))


def test_config_is_the_text_models(vlm):
    cfg = ModelConfig.from_path(vlm["transformers4"])
    text = json.loads((vlm["transformers4"] / "config.json").read_text())["text_config"]
    assert cfg.architecture == ARCH
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (
        text["hidden_size"], text["num_hidden_layers"], text["num_attention_heads"], text["num_key_value_heads"],
        text["head_dim"], text["vocab_size"])
    assert cfg.hf_config["model_type"] == "gemma3_text" and cfg.hf_config["sliding_window"] == 12
    assert cfg.tie_word_embeddings and cfg.dtype == "float32"


def test_the_renamed_text_tensors_are_exactly_the_models(vlm):
    """Every tensor outside the vision tower and projector gets a name in Gemma3ForCausalLM, and
    those are the shapes load_format=dummy draws: nothing of the text model is left unread."""
    for path in vlm.values():
        cfg = ModelConfig.from_path(path)
        rename, ours = TextWeights(cfg.architecture), {}
        for name, tensor in iter_safetensors(path, lazy=True):
            if (new := rename(name)) is not None:
                ours[new] = tuple(tensor.get_shape())
        ours.pop("lm_head.weight", None)  # tied
        assert dict(get_model_class(cfg.architecture).checkpoint_shapes(cfg)) == ours
        assert rename.skipped == sum(n.startswith(VISION) for n in checkpoint_names(path)) > 0


class WatchedOpen:
    """safetensors.safe_open that records the name of every tensor read from the file."""

    def __init__(self, real, opened: list[str]):
        self.real, self.opened = real, opened

    def __call__(self, *args, **kwargs):
        self.file = self.real(*args, **kwargs)
        return self

    def __enter__(self):
        self.inner = self.file.__enter__()
        return self

    def __exit__(self, *exc):
        return self.file.__exit__(*exc)

    def keys(self):
        return self.inner.keys()

    def get_slice(self, key):
        self.opened.append(key)
        return self.inner.get_slice(key)

    get_tensor = get_slice


def test_both_layouts_load_the_same_weights_and_skip_vision_unread(vlm, caplog, monkeypatch):
    import safetensors

    models = {}
    for layout, path in vlm.items():
        opened: list[str] = []
        monkeypatch.setattr(safetensors, "safe_open", WatchedOpen(safetensors.safe_open, opened))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="pagoda.runtime.models.text_only"):
            models[layout] = load_model(ModelConfig.from_path(path), torch.device("cpu"))
        monkeypatch.undo()
        assert opened and not [k for k in opened if k.startswith(VISION)], layout
        notes = [r.getMessage() for r in caplog.records if "serving text only" in r.getMessage()]
        assert len(notes) == 1 and "images are not supported" in notes[0], notes
    old, new = (dict(m.named_parameters()) for m in models.values())
    assert old.keys() == new.keys()
    for name, param in old.items():
        torch.testing.assert_close(new[name], param, rtol=0, atol=0, msg=name)


GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)


SETUPS = {"transformers4": dict(num_kv_blocks=18),  # 16 prompts cannot all hold their blocks: preemption
          "transformers5": dict(max_num_batched_tokens=12)}  # chunked prefill, chunks shorter than the window


def greedy_reference(hf_model):
    """transformers' greedy continuation of a prompt (input_ids only: the text path of the
    image-text model), computed once per prompt."""
    cache = {}

    def greedy(prompt: list[int]) -> list[int]:
        if tuple(prompt) not in cache:
            ids = torch.tensor([prompt])
            with torch.no_grad():
                out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW_TOKENS,
                                        do_sample=False)
            cache[tuple(prompt)] = out[0, len(prompt):].tolist()
        return cache[tuple(prompt)]
    return greedy


def assert_greedy_matches(model_dir, setup: dict, hf_greedy) -> None:
    """The engine's greedy outputs on make_prompts() equal transformers'; with num_kv_blocks in
    the setup, preemption must have happened."""
    prompts = make_prompts()
    llm = LLM(str(model_dir), block_size=8, max_model_len=128, device="cpu", **setup)
    outputs = llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY, use_tqdm=False)
    if "num_kv_blocks" in setup:
        assert llm.llm_engine.stats().num_preemptions > 0
    for prompt, out in zip(prompts, outputs):
        want = hf_greedy(prompt)
        assert out.outputs[0].token_ids == want, f"prompt of {len(prompt)}: engine {out.outputs[0].token_ids} != {want}"


@pytest.fixture(scope="module")
def hf_greedy(hf_vlm):
    return greedy_reference(hf_vlm)


@pytest.mark.parametrize("layout", list(SETUPS))
def test_greedy_matches_transformers_generate(vlm, hf_greedy, layout):
    assert_greedy_matches(vlm[layout], SETUPS[layout], hf_greedy)


def test_teacher_forced_logits_match_transformers(vlm, hf_vlm):
    rng = random.Random(11)
    total = [sum(phase[s] for phase in (PHASES["prefill"], PHASES["extend"])) + DECODE_STEPS for s in range(2)]
    seqs = [[rng.randrange(5, 512) for _ in range(n)] for n in total]
    got = engine_logits(str(vlm["transformers4"]), seqs)
    for s, seq in enumerate(seqs):
        with torch.no_grad():
            want = hf_vlm(input_ids=torch.tensor([seq])).logits[0].float()
        assert got[s].shape == want.shape
        assert (got[s] - want).abs().max() <= ATOL


def test_a_chat_template_kept_with_the_processor_is_used(vlm, tmp_path):
    """Image-text checkpoints may keep the template in chat_template.json (the processor's file),
    which AutoTokenizer does not read; the server's tokenizer takes it from there."""
    from transformers import AutoTokenizer

    from pagoda.runtime.frontend.tokenizer import apply_chat_template, load_tokenizer

    path = tmp_path / "processor_template"
    shutil.copytree(vlm["transformers4"], path)
    template = (path / "chat_template.jinja").read_text()
    (path / "chat_template.jinja").unlink()
    (path / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    assert AutoTokenizer.from_pretrained(path).chat_template is None  # what the fallback is for
    tokenizer = load_tokenizer(path)
    messages = [{"role": "user", "content": "hi"}]
    assert apply_chat_template(tokenizer, messages) == apply_chat_template(load_tokenizer(vlm["transformers4"]),
                                                                           messages)
