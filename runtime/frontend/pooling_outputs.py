"""What the pooling runner hands back, in vLLM's shapes: PoolingRequestOutput (LLM.encode), whose
outputs.data is a float32 tensor, and EmbeddingRequestOutput (LLM.embed), whose outputs.embedding
is a list of floats."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class PoolingOutput:
    data: torch.Tensor


@dataclass(slots=True)
class PoolingRequestOutput:
    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    finished: bool
    prompt: str | None = None
    num_cached_tokens: int = 0


@dataclass(slots=True)
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)

    @staticmethod
    def from_base(output: PoolingOutput) -> EmbeddingOutput:
        return EmbeddingOutput(output.data.tolist())


@dataclass(slots=True)
class EmbeddingRequestOutput:
    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool
    prompt: str | None = None

    @staticmethod
    def from_base(output: PoolingRequestOutput) -> EmbeddingRequestOutput:
        return EmbeddingRequestOutput(output.request_id, EmbeddingOutput.from_base(output.outputs),
                                      output.prompt_token_ids, output.finished, output.prompt)
