"""Reference sampler: temperature, top-k, top-p, min-p and seeded per-row sampling, in plain torch.

The contract the GPU sampler (pagoda.kernels.sampling) must meet, row by row:
- temperature <= GREEDY_EPS is greedy: the first index of the largest logit.
- Otherwise s = logits / temperature (float32), and the filters run in vLLM's order. min-p
  (min_p > 0) keeps s >= max(s) + log(min_p): a probability at least min_p times the top one.
  top-k (1..vocab-1; 0 or less, or vocab and more, turns it off) keeps logits at least the k-th
  largest. top-p (< 1) keeps the nucleus of what is left: the shortest prefix, sorted by
  probability renormalised over the survivors, whose mass before its last member is below top_p.
  The top-k and top-p cut-offs are logits of real tokens, compared exactly, so a boundary token
  never flickers with rounding.
- The survivor with the largest s - log(-log(u)) wins: the exponential race, equivalent to drawing
  from the renormalised distribution. u is uniform in [0, 1) from Philox-4x32-10 keyed by the
  row's seed, with counter (vocab index, step, 0, 0), exactly Triton's tl.rand with the int64
  offset step * 2**32 + index. A row's draw so depends only on its own seed, step and logits,
  never on the rest of the batch.
"""

import torch

GREEDY_EPS = 1e-5

_M32 = 0xFFFFFFFF
_PHILOX_KEY_A, _PHILOX_KEY_B = 0x9E3779B9, 0xBB67AE85
_PHILOX_ROUND_A, _PHILOX_ROUND_B = 0xD2511F53, 0xCD9E8D57


def _mul_hi_lo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of the 64-bit product a * b (a constant, b uint32 values held in
    int64), computed on 16-bit halves of a so no intermediate overflows int64."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    p_hi, p_lo = a_hi * b, a_lo * b  # each < 2**48
    hi = (p_hi + (p_lo >> 16)) >> 16
    lo = (((p_hi & 0xFFFF) << 16) + p_lo) & _M32
    return hi & _M32, lo


def philox_uniform(seed: int, offsets: torch.Tensor) -> torch.Tensor:
    """Triton's tl.rand(seed, offsets) for int64 offsets, as float32 in [0, 1)."""
    offsets = offsets.to(torch.int64)
    c0, c1 = offsets & _M32, (offsets >> 32) & _M32
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    seed &= 0xFFFFFFFFFFFFFFFF
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for _ in range(10):
        hi_b, lo_b = _mul_hi_lo(_PHILOX_ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(_PHILOX_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _PHILOX_KEY_A) & _M32, (k1 + _PHILOX_KEY_B) & _M32
    x = torch.where(c0 >= 2**31, c0 - 2**32, c0)  # reinterpret as int32
    x = torch.where(x < 0, -x - 1, x).to(torch.int32)
    return x.to(torch.float32) * torch.tensor(4.6566127342e-10, dtype=torch.float32)


def sample_ref(
    logits: torch.Tensor,  # [num_seqs, vocab]
    temperature: torch.Tensor,  # [num_seqs] float32
    top_k: torch.Tensor,  # [num_seqs] int32
    top_p: torch.Tensor,  # [num_seqs] float32
    min_p: torch.Tensor,  # [num_seqs] float32
    seeds: torch.Tensor,  # [num_seqs] int64
    steps: torch.Tensor,  # [num_seqs] int64, the row's decode step (its output-token count)
) -> torch.Tensor:
    """Sampled token ids, int64 [num_seqs]. One row at a time, for clarity over speed."""
    vocab = logits.shape[-1]
    out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    index = torch.arange(vocab, device=logits.device)
    for row in range(logits.shape[0]):
        x = logits[row].float()
        t = float(temperature[row])
        if t <= GREEDY_EPS:
            out[row] = int(torch.argmax(x))
            continue
        s = x / torch.tensor(t, dtype=torch.float32)
        keep = torch.ones(vocab, dtype=torch.bool, device=logits.device)
        mp = float(min_p[row])
        if mp > 0.0:
            keep &= s >= s.max() + torch.log(torch.tensor(mp, dtype=torch.float32))
        k = int(top_k[row])
        if 0 < k < vocab:
            keep &= x >= torch.sort(x, descending=True).values[k - 1]
        p = float(top_p[row])
        if p < 1.0:
            order = torch.argsort(x[keep], descending=True, stable=True)
            kept_x, kept_s = x[keep][order], s[keep][order]
            probs = torch.softmax(kept_s, dim=-1)
            mass_before = torch.cumsum(probs, dim=-1) - probs
            keep &= x >= kept_x[int((mass_before < p).sum()) - 1]
        u = philox_uniform(int(seeds[row]), int(steps[row]) * 2**32 + index)
        race = torch.where(keep, s - torch.log(-torch.log(u)), float("-inf"))
        out[row] = int(torch.argmax(race))
    return out
