"""Sampler: from the last position's logits to the next token of each request, vLLM's way.

Order of operations: raw logprobs (before any processing, as vLLM reports them), min_tokens
masking, penalties, then greedy argmax, or temperature, min-p, top-k/top-p and a draw. A draw is
argmax(probs / q) with q ~ Exp(1); a seeded request draws q from its own generator, so its tokens
do not depend on what else shares the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagoda.runtime.request import Request


@dataclass(slots=True)
class TokenLogprobs:
    """The sampled (or prompt) token first, then the top-k; ranks are 1-based."""

    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int]


@dataclass(slots=True)
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


def gather_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, k: list[int]) -> list[TokenLogprobs]:
    """For each row: the given token's logprob and rank, then the row's top k[i] tokens."""
    chosen = logprobs.gather(1, token_ids[:, None])  # [B, 1]
    ranks = (logprobs > chosen).sum(dim=1) + 1
    max_k = max(k) if k else 0
    top_vals, top_ids = logprobs.topk(max_k, dim=1) if max_k else (None, None)
    chosen, ranks, ids = chosen[:, 0].tolist(), ranks.tolist(), token_ids.tolist()
    top_vals = top_vals.tolist() if max_k else None
    top_ids = top_ids.tolist() if max_k else None
    out = []
    for i, n in enumerate(k):
        tl = TokenLogprobs([ids[i]], [chosen[i]], [ranks[i]])
        for j in range(n):
            tl.token_ids.append(top_ids[i][j])
            tl.logprobs.append(top_vals[i][j])
            tl.ranks.append(j + 1)
        out.append(tl)
    return out


class Sampler:
    def __init__(self, vocab_size: int, device: torch.device, seed: int = 0):
        self.vocab_size = vocab_size
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> SamplerOutput:
        logits = logits.float()
        params = [r.sampling_params for r in requests]
        want_logprobs = [p.logprobs is not None for p in params]
        raw_logprobs = torch.log_softmax(logits, dim=-1) if any(want_logprobs) else None
        logits = self._mask_stops_before_min_tokens(logits.clone(), requests)
        logits = self._apply_penalties(logits, requests)

        greedy = torch.tensor([p.greedy for p in params], device=logits.device)
        tokens = logits.argmax(dim=-1)
        if not bool(greedy.all()):
            tokens = torch.where(greedy, tokens, self._sample(logits, requests))

        logprobs: list[TokenLogprobs | None] = [None] * len(requests)
        if raw_logprobs is not None:
            rows = [i for i, w in enumerate(want_logprobs) if w]
            gathered = gather_logprobs(raw_logprobs[rows], tokens[rows], [params[i].logprobs for i in rows])
            for i, tl in zip(rows, gathered):
                logprobs[i] = tl
        return SamplerOutput(tokens.tolist(), logprobs)

    def _mask_stops_before_min_tokens(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        for i, r in enumerate(requests):
            p = r.sampling_params
            if r.num_output_tokens < p.min_tokens:
                stop_ids = list(p.stop_token_ids)
                if r.eos_token_id is not None and not p.ignore_eos:
                    stop_ids.append(r.eos_token_id)
                stop_ids = [t for t in stop_ids if t < logits.shape[1]]
                if stop_ids:
                    logits[i, stop_ids] = float("-inf")
        return logits

    def _apply_penalties(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        params = [r.sampling_params for r in requests]
        if all(
            p.repetition_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
            for p in params
        ):
            return logits
        vocab = logits.shape[1]
        dev = logits.device

        def bin_counts(seqs: list[list[int]]) -> torch.Tensor:
            width = max((len(s) for s in seqs), default=0)
            padded = torch.full((len(seqs), width), vocab, dtype=torch.long)
            for i, s in enumerate(seqs):
                padded[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            counts = torch.zeros(len(seqs), vocab + 1, dtype=torch.long)
            counts.scatter_add_(1, padded, torch.ones_like(padded))
            return counts[:, :vocab].to(dev)

        output_counts = bin_counts([r.output_token_ids for r in requests])
        output_mask = output_counts > 0
        prompt_mask = bin_counts([r.prompt_token_ids for r in requests]) > 0
        rep = torch.tensor([p.repetition_penalty for p in params], device=dev)[:, None].expand(-1, vocab)
        rep = torch.where(prompt_mask | output_mask, rep, torch.ones_like(rep))
        logits = torch.where(logits > 0, logits / rep, logits * rep)
        freq = torch.tensor([p.frequency_penalty for p in params], device=dev)[:, None]
        pres = torch.tensor([p.presence_penalty for p in params], device=dev)[:, None]
        return logits - freq * output_counts - pres * output_mask

    def _sample(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        params = [r.sampling_params for r in requests]
        dev = logits.device
        temp = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], device=dev)
        logits = logits / temp[:, None]

        min_p = torch.tensor([p.min_p for p in params], device=dev)
        if bool((min_p > 0).any()):
            probs = logits.softmax(dim=-1)
            threshold = probs.max(dim=-1, keepdim=True).values * min_p[:, None]
            logits = logits.masked_fill(probs < threshold, float("-inf"))

        top_k = [p.top_k if p.top_k > 0 else self.vocab_size for p in params]
        top_p = [p.top_p for p in params]
        if any(k < logits.shape[1] for k in top_k) or any(p < 1.0 for p in top_p):
            logits = apply_top_k_top_p(
                logits, torch.tensor(top_k, device=dev), torch.tensor(top_p, device=dev)
            )

        probs = logits.softmax(dim=-1)
        q = torch.empty_like(probs).exponential_(generator=self.generator)
        for i, r in enumerate(requests):
            if r.sampling_params.seed is not None:
                if r.generator is None:
                    seed = r.sampling_params.seed + r.index  # n > 1 children differ, as in vLLM V1
                    r.generator = torch.Generator(device=dev).manual_seed(seed)
                q[i].exponential_(generator=r.generator)
        return probs.div(q).argmax(dim=-1)


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Keep each row's k largest logits, then the smallest set whose probability reaches p."""
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    vocab = logits.shape[1]
    kth = sorted_logits.gather(1, (vocab - k.clamp(max=vocab)).long()[:, None])
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop = cum <= (1 - p[:, None])
    drop[:, -1] = False  # always keep the most likely token
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)
