"""PoolingParams: what a pooling request asks of its embedding (vLLM's PoolingParams, the embed part).

normalize=None takes the model's pooler config (pooling_config.py: normalized unless a
sentence-transformers checkpoint lists no Normalize module); dimensions truncates a matryoshka
model's vector before it is normalized; truncate_prompt_tokens keeps only the prompt's last k
tokens (-1: the last max_model_len).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pagoda.runtime.sampling_params import RequestOutputKind


@dataclass(slots=True)
class PoolingParams:
    dimensions: int | None = None
    normalize: bool | None = None
    truncate_prompt_tokens: int | None = None
    # A pooled request has one output, at the end; it never has a grammar.
    output_kind: ClassVar[RequestOutputKind] = RequestOutputKind.FINAL_ONLY
    structured_outputs: ClassVar[None] = None

    def __post_init__(self) -> None:
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError(f"dimensions must be at least 1, got {self.dimensions}")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < -1:
            raise ValueError(f"truncate_prompt_tokens must be -1 or more, got {self.truncate_prompt_tokens}")
