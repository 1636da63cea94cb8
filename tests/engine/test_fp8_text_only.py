"""FP8 image-text checkpoints served text only (RedHatAI's Mistral-Small-3.1-24B-Instruct-2503-FP8-dynamic
and the like): compressed-tensors FP8-dynamic whose `ignore` list names modules with the
vision-language model's prefixes, and a text layer it leaves unquantized, as llm-compressor does.

Two lists, one per rename direction: Mistral 3's in the published names (language_model.model.*,
`re:.*vision_tower.*`, language_model.lm_head), the tensors in the same names; Qwen2.5-VL's in
transformers 5's in-memory names (model.language_model.*, `re:model[.]visual[.].*`, lm_head, as an
export through transformers 5 writes them) over tensors in the published layout (model.layers.*).

The reference is transformers' own image-text class loading the FP8 checkpoint itself, dequantized
by the compressed-tensors package (CompressedTensorsConfig(dequantize=True)): it reads both
combinations (checked here: each of its weights is the checkpoint's q * scale, and the ignored
layer its stored weight), so no hand-made dequantized model is needed.
"""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch

from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.quantization.scheme import resolve_scheme
from pagoda.runtime.tools.tiny_models import build_tiny_model

from .conftest import make_prompts
from .fp8_checkpoints import PROJECTION, dequantize, write_fp8_checkpoint
from .test_logits_parity import ATOL, engine_logits

pytestmark = pytest.mark.skipif(importlib.util.find_spec("compressed_tensors") is None,
                                reason="pip install compressed-tensors (a runtime dependency of pyproject.toml)")

# tiny family -> (transformers class, the ignore list, the checkpoint module it leaves unquantized,
# that module's name in the text model)
CASES = {
    "mistral3_vlm": ("Mistral3ForConditionalGeneration",
                     ("language_model.lm_head", "re:.*vision_tower.*", "re:.*multi_modal_projector.*",
                      "language_model.model.layers.1.mlp.down_proj"),
                     "language_model.model.layers.1.mlp.down_proj", "model.layers.1.mlp.down_proj"),
    "qwen2_5_vl": ("Qwen2_5_VLForConditionalGeneration",
                   ("lm_head", "re:model[.]visual[.].*", "model.language_model.layers.0.self_attn.o_proj"),
                   "model.layers.0.self_attn.o_proj", "model.layers.0.self_attn.o_proj"),
}
TEXT_MODULES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                "mlp.up_proj", "mlp.down_proj")


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    family = request.param
    hf_class, ignore, keep, ours = CASES[family]
    root = tmp_path_factory.mktemp(f"fp8_{family}")
    src = build_tiny_model(root / "src", family)
    dst = write_fp8_checkpoint(src, root / "fp8", "compressed-tensors", ignore=ignore, keep=(keep,))
    return family, hf_class, keep, ours, dst


@pytest.fixture(scope="module")
def hf_fp8(case):
    import transformers
    from transformers import CompressedTensorsConfig

    _, hf_class, _, _, dst = case
    return getattr(transformers, hf_class).from_pretrained(
        dst, dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True)).eval()


def test_the_scheme_sees_the_text_modules_through_the_renames(case):
    _, _, _, ours, dst = case
    scheme = resolve_scheme(ModelConfig.from_path(dst).hf_config, None)
    assert scheme.activations == "dynamic-token" and scheme.renames
    for layer in range(2):
        for module in TEXT_MODULES:
            name = f"model.layers.{layer}.{module}"
            assert scheme.quantizes([name]) == (name != ours), name
    assert not scheme.quantizes(["lm_head"])


def test_the_reference_reads_the_checkpoint_as_written(case, hf_fp8):
    """transformers' dequantized weights are the checkpoint's q * scale, the left-out layer as stored."""
    from safetensors.torch import load_file

    _, _, keep, _, dst = case
    tensors, params = load_file(dst / "model.safetensors"), dict(hf_fp8.named_parameters())
    seen = 0
    for name, q in tensors.items():
        if match := PROJECTION.fullmatch(name):
            text = name.replace("language_model.model.", "model.").replace("model.", "model.language_model.", 1)
            fp8 = match.group(1) != keep
            assert (q.dtype == torch.float8_e4m3fn) == fp8, name
            want = dequantize(q, tensors[f"{match.group(1)}.weight_scale"]) if fp8 else q.float()
            assert torch.equal(params[text].float(), want), name
            seen += 1
    assert seen == 2 * len(TEXT_MODULES)


def test_fp8_logits_match_transformers(case, hf_fp8):
    _, _, _, _, dst = case
    rng = random.Random(5)
    seqs = [[rng.randrange(5, 512) for _ in range(n)] for n in (40, 44)]
    got = engine_logits(str(dst), seqs)
    for s, seq in enumerate(seqs):
        with torch.no_grad():
            want = hf_fp8(input_ids=torch.tensor([seq])).logits[0].float()
        assert (got[s] - want).abs().max() <= ATOL


def test_fp8_greedy_output_matches_transformers(case, hf_fp8):
    _, _, _, _, dst = case
    prompts = make_prompts()[:4]
    llm = LLM(str(dst), block_size=8, max_model_len=128, device="cpu")
    outputs = llm.generate(prompt_token_ids=prompts, use_tqdm=False,
                           sampling_params=SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    for prompt, out in zip(prompts, outputs):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            want = hf_fp8.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8,
                                   do_sample=False)[0, len(prompt):].tolist()
        assert out.outputs[0].token_ids == want
