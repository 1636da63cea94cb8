"""Request fields that shape the prompt or the response rather than the sampling: truncate_prompt_tokens,
prompt_logprobs in vLLM's shape, and OpenAI's logit_bias keys (token ids written as strings)."""

from __future__ import annotations

from pagoda.runtime.frontend.server.errors import bad_request
from pagoda.runtime.frontend.server.protocol import PromptLogprob, PromptLogprobs, UsageInfo


def truncate_prompt(ids: list[int], k: int | None, side: str | None, max_model_len: int) -> list[int]:
    """vLLM's truncate_prompt_tokens: keep the last k tokens (the first k with truncation_side
    "right"); -1 means max_model_len; more than max_model_len is a 400."""
    if k is None:
        return ids
    if k == -1:
        k = max_model_len
    if k > max_model_len:
        raise bad_request(f"truncate_prompt_tokens ({k}) is more than max_model_len ({max_model_len})",
                          param="truncate_prompt_tokens")
    if k == 0:
        raise bad_request("truncate_prompt_tokens must keep at least one token", param="truncate_prompt_tokens")
    if len(ids) <= k:
        return ids
    return ids[:k] if side == "right" else ids[-k:]


def parse_logit_bias(logit_bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's logit_bias: token ids as strings, each bias in [-100, 100] (OpenAI refuses what
    vLLM would clamp). Whether the ids are in the vocabulary is the caller's check."""
    if not logit_bias:
        return None
    out = {}
    for key, bias in logit_bias.items():
        if not key.isascii() or not key.isdigit():
            raise bad_request(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias")
        if not -100.0 <= bias <= 100.0:
            raise bad_request(f"logit_bias values must be in [-100, 100], got {bias} for token {key}",
                              param="logit_bias")
        out[int(key)] = bias
    return out


def prompt_logprobs_json(entries) -> PromptLogprobs | None:
    """RequestOutput.prompt_logprobs as vLLM serves it: None for the first token, then token id ->
    {logprob, rank, decoded_token}, with -inf as -9999.0 (vLLM's clamp_prompt_logprobs; JSON has no -inf)."""
    if entries is None:
        return None
    return [None if e is None else
            {t: PromptLogprob(logprob=max(lp.logprob, -9999.0), rank=lp.rank, decoded_token=lp.decoded_token)
             for t, lp in e.items()}
            for e in entries]


def usage(prompt_tokens: int, completion_tokens: int) -> UsageInfo:
    return UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                     total_tokens=prompt_tokens + completion_tokens)
