"""architectures[0] in config.json -> the class that runs it."""

from __future__ import annotations

import importlib

_REGISTRY = {
    "LlamaForCausalLM": ("pagoda.runtime.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("pagoda.runtime.models.llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("pagoda.runtime.models.llama", "LlamaForCausalLM"),
}

SUPPORTED_ARCHITECTURES = tuple(_REGISTRY)


def get_model_class(architecture: str):
    if architecture not in _REGISTRY:
        raise ValueError(
            f"model architecture {architecture!r} is not supported; "
            f"supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    module, name = _REGISTRY[architecture]
    return getattr(importlib.import_module(module), name)
