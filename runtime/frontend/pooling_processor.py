"""The frontend's half of a pooling request: checked and cut into a core request on the way in,
and its raw pooled vector finished (matryoshka truncation, then L2 normalization) on the way out.

A pooling request is a prompt the core prefills and pools, with nothing to sample: it may use the
whole context (a generated request needs room for one output token), and it ends with one output,
which the PoolingOutputProcessor turns into a PoolingRequestOutput. The metrics follow vLLM's for
pooling requests: the prompt tokens count, the time to the vector is the time to first token, and
no tokens are generated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pagoda.runtime.core.engine_core import EngineCoreRequest
from pagoda.runtime.core.outputs import EngineCoreOutput
from pagoda.runtime.frontend.pooling_outputs import PoolingOutput, PoolingRequestOutput
from pagoda.runtime.pooling_config import PoolerConfig
from pagoda.runtime.pooling_params import PoolingParams
from pagoda.runtime.sampling_params import RequestOutputKind, SamplingParams

# What the core's scheduler reads of a request's sampling; a pooled request is never sampled.
_NO_SAMPLING = SamplingParams(max_tokens=1, output_kind=RequestOutputKind.FINAL_ONLY)


def truncate_prompt(prompt_token_ids: list[int], truncate: int | None, max_model_len: int) -> list[int]:
    """vLLM's truncate_prompt_tokens: keep the last k tokens (-1: the last max_model_len)."""
    if truncate is None:
        return prompt_token_ids
    keep = max_model_len if truncate == -1 else truncate
    return prompt_token_ids[-keep:] if keep else []


def pooling_request(request_id: str, prompt_token_ids: list[int], params: PoolingParams, arrival_time: float,
                    max_model_len: int) -> EngineCoreRequest:
    """The core request, or a ValueError that says what is wrong (ids are checked by the caller)."""
    if not prompt_token_ids:
        raise ValueError("the input is empty: give at least one token")
    if len(prompt_token_ids) > max_model_len:
        raise ValueError(f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                         f"{len(prompt_token_ids)} tokens in the input for embedding generation. Please reduce "
                         "the length of the input.")
    return EngineCoreRequest(request_id, list(prompt_token_ids), _NO_SAMPLING, None, 1, arrival_time)


def finish_vector(raw: np.ndarray, normalize: bool, dimensions: int | None = None) -> np.ndarray:
    """Matryoshka truncation, then L2 normalization (vLLM's order; F.normalize's eps)."""
    vector = np.asarray(raw, dtype=np.float32)
    if dimensions is not None:
        vector = vector[:dimensions]
    if normalize:
        vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
    return vector


@dataclass(slots=True)
class PoolingState:
    prompt: str | None
    prompt_token_ids: list[int]
    params: PoolingParams
    arrival_time: float


class PoolingOutputProcessor:
    """The pooling runner's OutputProcessor: the same interface, one output per request."""

    def __init__(self, pooler_config: PoolerConfig, metrics=None):
        self.pooler_config = pooler_config
        self.metrics = metrics  # the server's ServerMetrics, or None
        self.states: dict[str, PoolingState] = {}

    def has_stop_strings(self) -> bool:
        return False

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params,
                    arrival_time: float) -> None:
        if not isinstance(params, PoolingParams):
            raise ValueError("this engine runs the pooling runner: it makes embeddings, not text")
        if request_id in self.states:
            raise ValueError(f"request id {request_id!r} is already in use")
        self.states[request_id] = PoolingState(prompt, list(prompt_token_ids), params, arrival_time)

    def forget(self, request_id: str) -> None:
        self.states.pop(request_id, None)

    def abort_requests(self, request_ids: list[str], now: float) -> tuple[list, list[str]]:
        """Abort these; a pooled request has no partial result, so no output comes back."""
        aborted = []
        for request_id in request_ids:
            state = self.states.pop(request_id, None)
            if state is not None:
                aborted.append(request_id)
                if self.metrics is not None:
                    self.metrics.on_finish("abort", now - state.arrival_time, len(state.prompt_token_ids))
        return [], aborted

    def process_outputs(self, core_outputs: list[EngineCoreOutput], now: float
                        ) -> tuple[list[PoolingRequestOutput], list[str]]:
        outputs = []
        for o in core_outputs:
            state = self.states.pop(o.request_id, None)
            if state is None or o.finish_reason is None:
                continue  # aborted since
            num_prompt = len(state.prompt_token_ids)
            if self.metrics is not None:
                scheduled = o.first_scheduled_time or now
                self.metrics.on_first_token(num_prompt, now - state.arrival_time,
                                            max(0.0, scheduled - state.arrival_time))
                self.metrics.on_finish(o.finish_reason, now - state.arrival_time, num_prompt, 0,
                                       o.first_scheduled_time, now, now, now)
            if o.pooled is None:
                continue  # ended without a vector (never expected): its caller gets no output
            p = state.params
            normalize = self.pooler_config.normalize if p.normalize is None else p.normalize
            vector = finish_vector(o.pooled, normalize, p.dimensions)
            outputs.append(PoolingRequestOutput(o.request_id, PoolingOutput(torch.from_numpy(vector)),
                                                state.prompt_token_ids, True, state.prompt, o.num_cached_tokens))
        return outputs, []
