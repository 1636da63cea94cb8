"""Sampler: from the last position's logits to the next token of each request, vLLM's way.

Order of operations: the grammar bitmask of structured-output rows (vLLM applies it before the
sampler, so its logprobs see it too), raw logprobs (before any other processing, as vLLM reports
them), allowed_token_ids, bad_words and logit_bias (token_constraints.py), min_tokens masking,
penalties, then greedy argmax, or temperature, min-p, top-k, top-p and a draw by
pagoda.kernels.ops.sample (Triton on the GPU). A draw is counter-based: each row's uniforms come
from its own seed and its output-token count, so its tokens never depend on what else shares the
batch, and the batch's parameters are host-side facts, so nothing waits on the GPU until the
sampled ids are read. A seeded request uses seed + index (n > 1 children differ, as in vLLM V1);
an unseeded one gets a seed from the engine's generator the first time it samples.
"""

from __future__ import annotations

import random
from operator import attrgetter

import torch

from pagoda.kernels import ops
from pagoda.runtime.core.outputs import TokenLogprobs
from pagoda.runtime.core.request import Request
from pagoda.runtime.worker.host_to_device import index_on
from pagoda.runtime.worker.token_constraints import apply_token_constraints

_PLAIN_GREEDY = attrgetter("plain_greedy")


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


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """torch.argmax over the last dim (first index on ties), fast for a few rows.

    torch reduces each row with one thread block, so one row of a 128k vocabulary takes ~37 us on
    the H200 (1% of a W2 step). With few rows the vocabulary is cut into up to 256 equal chunks
    reduced in parallel, then the chunk maxima: both stages keep the first maximal index, so the
    result is argmax's."""
    rows, vocab = logits.shape
    chunks = min(256, vocab & -vocab)  # the largest power of two that divides the vocabulary
    if rows >= 32 or chunks < 16:
        return logits.argmax(dim=-1)
    values, index = logits.reshape(rows, chunks, vocab // chunks).max(dim=-1)
    best = values.argmax(dim=-1, keepdim=True)
    return (best * (vocab // chunks) + index.gather(-1, best)).squeeze(-1)


class Sampler:
    def __init__(self, vocab_size: int, device: torch.device, seed: int = 0):
        self.vocab_size = vocab_size
        self.device = device
        self.rng = random.Random(seed)
        self.structured_outputs = None  # the core's StructuredOutputManager, which fills bitmasks
        self._bitmask: torch.Tensor | None = None

    def sample(
        self, logits: torch.Tensor, requests: list[Request], pending: int | list[int] = 0
    ) -> tuple[torch.Tensor, list[TokenLogprobs | None]]:
        """The sampled ids as a device tensor (nothing read back yet, unless logprobs were asked
        for: those are host lists), and each row's logprobs or None. pending: output tokens each
        request has in flight, not yet appended (1 for a step scheduled ahead; per row for one
        scheduled ahead of a mixed step)."""
        if all(map(_PLAIN_GREEDY, requests)):
            # The common offline case, in one pass over the rows: the general path below would
            # find every row greedy with nothing to mask, and take this very argmax.
            return greedy_argmax(logits), [None] * len(requests)
        params = [r.sampling_params for r in requests]
        # A row whose request finished since it was scheduled (its grammar may have terminated) is
        # dropped after sampling: it needs no mask.
        grammar_rows = [i for i, r in enumerate(requests) if r.grammar is not None and not r.is_finished]
        if grammar_rows:
            self._apply_grammars(logits, requests, grammar_rows)
        logprob_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        raw_logprobs = None
        if logprob_rows:
            raw_logprobs = torch.log_softmax(logits[logprob_rows].float(), dim=-1)
        if isinstance(pending, int):
            pending = [pending] * len(requests)
        banned = self._stops_before_min_tokens(logits.shape[1], requests, pending)
        penalized = any(p.has_penalties for p in params)
        constrained = [i for i, p in enumerate(params) if p.constrains_tokens]
        if banned or penalized or constrained:
            logits = logits.float().clone()
            if constrained:
                apply_token_constraints(logits, requests, constrained)
            if banned:
                self._ban(logits, banned)
            if penalized:
                logits = self._apply_penalties(logits, requests)

        if all(p.greedy for p in params):
            tokens = greedy_argmax(logits)  # exact on bf16 too: widening to fp32 keeps the order
        else:
            tokens = self._sample(logits, requests, pending)

        logprobs: list[TokenLogprobs | None] = [None] * len(requests)
        if raw_logprobs is not None:
            gathered = gather_logprobs(
                raw_logprobs, tokens[logprob_rows], [params[i].logprobs for i in logprob_rows]
            )
            for i, tl in zip(logprob_rows, gathered):
                logprobs[i] = tl
        return tokens, logprobs

    def _apply_grammars(self, logits: torch.Tensor, requests: list[Request], rows: list[int]) -> None:
        """Mask, in place and on the logits' device, every token the row's grammar forbids next.
        The bitmask is filled on the host from the matchers (the forward pass is already queued
        on the GPU meanwhile) and sent in one copy. The host buffer is reused: the step that last
        used it was read back before this one's matchers could see its tokens, so its copy is done."""
        import xgrammar as xgr

        dev = logits.device
        bitmask = self._bitmask_rows(len(rows), dev)
        self.structured_outputs.fill_bitmask([requests[i].grammar for i in rows], bitmask)
        if dev.type == "cuda":
            bitmask = bitmask.to(dev, non_blocking=True)
            backend = "auto"  # xgrammar's Triton kernel
        else:
            backend = "cpu" if logits.dtype == torch.float32 else "torch_native"
        if len(rows) == logits.shape[0]:
            xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[1], backend=backend)
            return
        index = index_on(dev, rows)
        sub = logits[index]
        xgr.apply_token_bitmask_inplace(sub, bitmask, vocab_size=logits.shape[1], backend=backend)
        logits[index] = sub

    def _bitmask_rows(self, n: int, device: torch.device) -> torch.Tensor:
        """n rows of a host bitmask kept across steps (pinned for CUDA, so its copy is asynchronous)."""
        if self._bitmask is None or self._bitmask.shape[0] < n:
            width = -(-self.vocab_size // 32)
            self._bitmask = torch.empty((max(n, 64), width), dtype=torch.int32, pin_memory=device.type == "cuda")
        return self._bitmask[:n]

    @staticmethod
    def _stops_before_min_tokens(vocab: int, requests: list[Request], pending: list[int]) -> tuple[list, list]:
        """(rows, token ids) of the stop tokens that may not be sampled yet (min_tokens), or ()."""
        rows, cols = [], []
        for i, r in enumerate(requests):
            p = r.sampling_params
            if r.num_output_tokens + pending[i] >= p.min_tokens:
                continue
            stop_ids = list(p.stop_token_ids)
            if r.eos_token_id is not None and not p.ignore_eos:
                stop_ids.append(r.eos_token_id)
            for t in stop_ids:
                if t < vocab:
                    rows.append(i)
                    cols.append(t)
        return (rows, cols) if rows else ()

    @staticmethod
    def _ban(logits: torch.Tensor, banned: tuple[list, list]) -> None:
        """logits[rows, ids] = -inf in one scatter."""
        index = index_on(logits.device, banned)
        logits[index[0], index[1]] = float("-inf")

    def _apply_penalties(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        params = [r.sampling_params for r in requests]
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

    def _seed(self, r: Request) -> int:
        if r.sampling_params.seed is not None:
            return (r.sampling_params.seed + r.index) % 2**63
        if r.generator is None:  # the request's own seed, kept across steps and preemptions
            r.generator = self.rng.getrandbits(63)
        return r.generator

    def _sample(self, logits: torch.Tensor, requests: list[Request], pending: list[int]) -> torch.Tensor:
        params = [r.sampling_params for r in requests]
        vocab = logits.shape[1]
        floats = torch.tensor(
            [
                [0.0 if p.greedy else p.temperature for p in params],
                [p.top_p for p in params],
                [p.min_p for p in params],
            ],
            dtype=torch.float32,
        ).to(logits.device, non_blocking=True)
        ints = torch.tensor(
            [
                [p.top_k for p in params],
                [self._seed(r) for r in requests],
                [r.num_output_tokens + k for r, k in zip(requests, pending)],
            ],
            dtype=torch.int64,
        ).to(logits.device, non_blocking=True)
        need_cutoffs = any(0 < p.top_k < vocab or p.top_p < 1.0 for p in params)
        return ops.sample(
            logits, floats[0], ints[0], floats[1], floats[2], ints[1], ints[2],
            all_greedy=False, need_cutoffs=need_cutoffs,
        )
