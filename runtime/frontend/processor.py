"""InputProcessor: a user request checked once, on the frontend's side, and cut into core requests.

The core trusts what it receives: the prompt's ids are in the vocabulary, prompt plus output fit in
max_model_len, logprobs stay within max_logprobs. The EOS ids come from the tokenizer and
generation_config.json (Llama 3's <|eot_id|> stops like a stop token id), and a request with n > 1
becomes n children, "<id>#<index>", which the core schedules side by side.
"""

from __future__ import annotations

import dataclasses

from pagoda.runtime.core.engine_core import EngineCoreRequest
from pagoda.runtime.frontend.pooling_processor import pooling_request
from pagoda.runtime.frontend.structured_outputs import GrammarChecker
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.pooling_params import PoolingParams
from pagoda.runtime.sampling_params import InvalidParam, SamplingParams


def child_ids(request_id: str, n: int) -> list[str]:
    return [request_id] if n == 1 else [f"{request_id}#{i}" for i in range(n)]


class InputProcessor:
    def __init__(self, model_config: ModelConfig, tokenizer, max_logprobs: int = 20,
                 disable_any_whitespace: bool = False):
        self.max_model_len = model_config.max_model_len
        self.vocab_size = model_config.vocab_size
        self.max_logprobs = max_logprobs
        eos = tokenizer.eos_token_id
        if eos is None and model_config.eos_token_ids:
            eos = model_config.eos_token_ids[0]
        self.eos_token_id = eos
        self.extra_eos_ids = [t for t in model_config.eos_token_ids if t != eos]
        self.tokenizer = tokenizer
        self.grammars = GrammarChecker(tokenizer, model_config.vocab_size)
        self.disable_any_whitespace = disable_any_whitespace
        self.pooling = False  # the pooling runner: PoolingParams requests only (set by the engine's owner)

    def process(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                arrival_time: float) -> list[EngineCoreRequest]:
        """The request's core requests, or a ValueError that says what is wrong with it."""
        max_len = self.max_model_len
        if self.pooling != isinstance(params, PoolingParams):
            raise ValueError("this engine runs the pooling runner: it makes embeddings, not text" if self.pooling
                             else "this engine generates text; embeddings need the pooling runner (--runner pooling)")
        if self.pooling:
            if prompt_token_ids and not _valid_token_ids(prompt_token_ids, self.vocab_size):
                raise ValueError(f"prompt token ids must be in [0, {self.vocab_size})")
            return [pooling_request(request_id, prompt_token_ids, params, arrival_time, max_len)]
        if not prompt_token_ids:
            raise ValueError("the prompt is empty: give at least one token")
        if not _valid_token_ids(prompt_token_ids, self.vocab_size):
            raise ValueError(f"prompt token ids must be in [0, {self.vocab_size})")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > self.max_logprobs:
                raise ValueError(f"{name}={value} is more than max_logprobs={self.max_logprobs}; ask for "
                                 "fewer, or start the engine with a larger --max-logprobs")
        num_prompt = len(prompt_token_ids)
        max_tokens = params.max_tokens if params.max_tokens is not None else max_len - num_prompt
        if num_prompt + max(max_tokens, 1) > max_len:
            raise ValueError(
                f"this request needs {num_prompt} prompt tokens + {max_tokens} max_tokens = "
                f"{num_prompt + max_tokens} tokens, more than max_model_len={max_len}; "
                "shorten the prompt or lower max_tokens"
            )
        if params.structured_outputs is not None:
            so = params.structured_outputs
            self.grammars.check(so)
            if self.disable_any_whitespace and not so.disable_any_whitespace and so.kind in ("json", "json_object"):
                params = params.clone(structured_outputs=dataclasses.replace(so, disable_any_whitespace=True))
        params = self._check_token_constraints(params)
        if self.extra_eos_ids and not params.ignore_eos:
            params = params.clone(stop_token_ids=params.stop_token_ids + self.extra_eos_ids)
        prompt = list(prompt_token_ids)
        return [
            EngineCoreRequest(child, prompt, params, self.eos_token_id, max_tokens, arrival_time,
                              parent_id=request_id, index=i)
            for i, child in enumerate(child_ids(request_id, params.n))
        ]

    def _check_token_constraints(self, params: SamplingParams) -> SamplingParams:
        vocab = self.vocab_size
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise InvalidParam(f"logit_bias holds token id {max(params.logit_bias)}, out of the vocabulary "
                               f"(ids 0..{vocab - 1})", "logit_bias")
        if params.allowed_token_ids and max(params.allowed_token_ids) >= vocab:
            raise InvalidParam(f"allowed_token_ids holds token id {max(params.allowed_token_ids)}, out of the "
                               f"vocabulary (ids 0..{vocab - 1})", "allowed_token_ids")
        if params.bad_words and params._bad_words_token_ids is None:
            ids = bad_words_token_ids(self.tokenizer, params.bad_words)
            if any(t >= vocab for word in ids for t in word):
                raise InvalidParam("bad_words tokenize to ids outside the model's vocabulary", "bad_words")
            params = params.clone(_bad_words_token_ids=ids)
        return params


def bad_words_token_ids(tokenizer, words: list[str]) -> list[list[int]]:
    """vLLM's SamplingParams.update_from_tokenizer: each word as it tokenizes alone, and with a leading
    space when that spells it with a different first token in as many tokens (a word inside text)."""
    out: list[list[int]] = []
    for word in words:
        bare = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        out.append(bare)
        if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
            out.append(spaced)
    return out


def _valid_token_ids(token_ids: list[int], vocab_size: int) -> bool:
    # min/max and a type scan in C: a per-token generator costs ~0.2 ms per 1k-token prompt.
    if not all(map(int.__instancecheck__, token_ids)):
        return False
    return 0 <= min(token_ids) and max(token_ids) < vocab_size
