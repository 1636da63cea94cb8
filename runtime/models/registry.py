"""architectures[0] in config.json -> the class that runs it."""

from __future__ import annotations

import importlib

from pagoda.runtime.models.text_only import TEXT_ONLY, text_architecture

_REGISTRY = {
    "LlamaForCausalLM": ("pagoda.runtime.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("pagoda.runtime.models.llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("pagoda.runtime.models.llama", "LlamaForCausalLM"),
    "Qwen3ForCausalLM": ("pagoda.runtime.models.qwen3", "Qwen3ForCausalLM"),
    "MixtralForCausalLM": ("pagoda.runtime.models.mixtral", "MixtralForCausalLM"),
    "Qwen3MoeForCausalLM": ("pagoda.runtime.models.qwen3_moe", "Qwen3MoeForCausalLM"),
    "Gemma2ForCausalLM": ("pagoda.runtime.models.gemma2", "Gemma2ForCausalLM"),
    "Gemma3ForCausalLM": ("pagoda.runtime.models.gemma3", "Gemma3ForCausalLM"),
    "Phi3ForCausalLM": ("pagoda.runtime.models.phi3", "Phi3ForCausalLM"),
}
# What AutoModel saves (no LM head): embedding checkpoints, served by the pooling runner
# (models/pooling_adapter.py adds the `model.` prefix their tensor names lack).
_REGISTRY |= {bare: _REGISTRY[causal] for bare, causal in (
    ("LlamaModel", "LlamaForCausalLM"), ("MistralModel", "MistralForCausalLM"), ("Qwen2Model", "Qwen2ForCausalLM"),
    ("Qwen3Model", "Qwen3ForCausalLM"), ("Gemma2Model", "Gemma2ForCausalLM"), ("Gemma3TextModel", "Gemma3ForCausalLM"),
    ("Phi3Model", "Phi3ForCausalLM"))}

# Image-text checkpoints, served text only by their language model's class (models/text_only.py).
_REGISTRY |= {vlm: _REGISTRY[text_architecture(vlm)] for vlm in TEXT_ONLY}

SUPPORTED_ARCHITECTURES = tuple(_REGISTRY)


def check_supported(architecture: str) -> None:
    """Raise a ValueError naming the supported set (no import of torch: `pagoda plan` calls it)."""
    if architecture not in _REGISTRY:
        raise ValueError(
            f"model architecture {architecture!r} is not supported; "
            f"supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )


def get_model_class(architecture: str):
    check_supported(architecture)
    module, name = _REGISTRY[architecture]
    return getattr(importlib.import_module(module), name)
