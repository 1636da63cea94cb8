"""A causal LM served by the pooling runner: the same model without its LM head (vLLM's
as_embedding_model). Embeddings are pooled from the final norm's hidden states, so the head is
never run; dropping it saves its memory (a 128k-vocabulary head is 1 GiB at 8B scale).

A checkpoint saved by AutoModel (architecture LlamaModel, Qwen2Model, ...) names its tensors
without the `model.` prefix and has no head: its names get the prefix here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from torch import nn


def as_pooling_model(model: nn.Module) -> nn.Module:
    if hasattr(model, "lm_head"):
        del model.lm_head
    return model


def pooling_weights(weights: Iterable[tuple[str, object]]) -> Iterator[tuple[str, object]]:
    for name, tensor in weights:
        if name.startswith("lm_head."):
            continue
        yield (name if name.startswith("model.") else "model." + name), tensor
