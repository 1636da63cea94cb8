"""What the engine core hands the frontend after each step: token ids and numbers, never text.

One EngineCoreOutput per request that progressed in the step. The core has no tokenizer, so
turning these into text, stop strings, logprob dicts and RequestOutputs is the frontend's work
(pagoda.runtime.frontend.output_processor). The record is a NamedTuple: a step with a thousand
requests builds a thousand of them, and across the process boundary they pickle as plain tuples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(slots=True)
class TokenLogprobs:
    """The sampled (or prompt) token first, then the top-k; ranks are 1-based."""

    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int]


class EngineCoreOutput(NamedTuple):
    request_id: str  # the core request: for n > 1, one child ("<id>#<index>")
    new_token_ids: list[int]  # empty while a prompt is being prefilled in chunks
    new_logprobs: list[TokenLogprobs] | None  # one per new token, when the request asked for them
    new_prompt_logprobs: list[TokenLogprobs] | None  # prompt positions scored in this step
    finish_reason: str | None  # "stop" (EOS, a stop token), "length", or None while running
    stop_reason: int | None  # the stop token id that ended it
    num_cached_tokens: int  # prompt tokens found in the prefix cache on first scheduling
    first_scheduled_time: float | None  # time.monotonic() of its first schedule (queue time)
    num_preemptions: int
    pooled: object = None  # pooling runner: the prompt's pooled vector (float32 numpy), when it finishes


@dataclass(slots=True)
class EngineStats:
    """The core's gauges and counters after a step (the metrics endpoint reads them)."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    kv_capacity_tokens: int
    num_preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    prompt_tokens: int
    generation_tokens: int
