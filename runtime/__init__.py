"""pagoda.runtime: the inference engine, the OpenAI-compatible server and the CLI.

The public names are loaded lazily, so that importing the CLI (or `pagoda.runtime.plan`) does not
import torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "LLM": "pagoda.runtime.frontend.llm",
    "SamplingParams": "pagoda.runtime.sampling_params",
    "StructuredOutputsParams": "pagoda.runtime.structured_outputs_params",
    "RequestOutput": "pagoda.runtime.frontend.outputs",
    "CompletionOutput": "pagoda.runtime.frontend.outputs",
    "PoolingParams": "pagoda.runtime.pooling_params",
    "PoolingRequestOutput": "pagoda.runtime.frontend.pooling_outputs",
    "EmbeddingRequestOutput": "pagoda.runtime.frontend.pooling_outputs",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pagoda.runtime' has no attribute {name!r}")
