"""Token-level constraints on a batch's logits: allowed_token_ids, bad_words and logit_bias.

vLLM V1's order: the allowed set first (every other token to -inf), then the bad words, then the
bias, all before min_tokens and the penalties. Each is a few sparse tensor ops over only the rows
that ask for it, whatever the batch holds, so a batch without constraints pays one check per row
on the host and nothing on the device. The ids and values are flat host lists sent in one
non-blocking copy each; nothing is read back.

A bad word bans its last token when the tokens before it end the output so far (vLLM's
apply_bad_words: only the generated tokens count, not the prompt). A word of one token is always
banned; a longer one needs the output on the host, so its request never samples ahead
(SamplingParams.needs_history).
"""

from __future__ import annotations

import torch

from pagoda.runtime.core.request import Request
from pagoda.runtime.worker.host_to_device import index_on, tensor_on


def apply_token_constraints(logits: torch.Tensor, requests: list[Request], rows: list[int]) -> None:
    """Edit the float logits in place for rows (indexes into requests) whose params constrain them."""
    allowed_rows, allowed_cols, allowed_owner = [], [], []
    bias_rows, bias_cols, bias_vals = [], [], []
    ban_rows, ban_cols = [], []
    for i in rows:
        r = requests[i]
        p = r.sampling_params
        if p.allowed_token_ids:
            allowed_owner.append(i)
            allowed_rows += [i] * len(p.allowed_token_ids)
            allowed_cols += p.allowed_token_ids
        if p._bad_words_token_ids:
            out = r.output_token_ids
            for word in p._bad_words_token_ids:
                prefix = len(word) - 1
                if prefix == 0 or (prefix <= len(out) and out[len(out) - prefix:] == word[:prefix]):
                    ban_rows.append(i)
                    ban_cols.append(word[-1])
        if p.logit_bias:
            bias_rows += [i] * len(p.logit_bias)
            bias_cols += p.logit_bias.keys()
            bias_vals += p.logit_bias.values()
    dev = logits.device
    if allowed_owner:
        # Keep the allowed logits, sink the rows, put the kept ones back: no dense [rows, vocab] mask.
        index = index_on(dev, [allowed_rows, allowed_cols])
        kept = logits[index[0], index[1]]
        logits.index_fill_(0, index_on(dev, allowed_owner), float("-inf"))
        logits[index[0], index[1]] = kept
    if ban_rows:
        index = index_on(dev, [ban_rows, ban_cols])
        logits[index[0], index[1]] = float("-inf")
    if bias_rows:
        index = index_on(dev, [bias_rows, bias_cols])
        logits.index_put_((index[0], index[1]), tensor_on(dev, bias_vals, logits.dtype), accumulate=True)
