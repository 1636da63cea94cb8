"""GPU sampler: temperature, top-k, top-p, min-p and seeded per-row sampling, without host syncs.

The contract is sampling_ref's. The work is split in two:
- top-k and top-p need the row's order, so one torch.sort per step turns them into a single logit
  cut-off per row (the k-th largest logit, and the smallest logit of the nucleus, which is taken
  after min-p and top-k, in vLLM's order). It runs only
  when some row asks for either (the need_cutoffs hint, which the batch builder knows on the host).
- One Triton program per row then streams the vocabulary: a first pass finds max(s) when the row
  has min_p, the second runs the exponential race, argmax(s - log(-log(u))) over the survivors,
  with u drawn by tl.rand from the row's seed at offset step * 2**32 + index. Greedy rows take the
  plain argmax in the same pass. Only the sampled ids ever leave the GPU.
"""

import torch
import triton
import triton.language as tl

from pagoda.kernels.sampling_ref import GREEDY_EPS

BLOCK_V = 1024


@triton.jit
def _sample_kernel(
    logits_ptr, stride_l, temperature_ptr, cutoff_ptr, min_p_ptr, seeds_ptr, steps_ptr, out_ptr,
    vocab, greedy_eps,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride_l
    t = tl.load(temperature_ptr + row)
    greedy = t <= greedy_eps
    t = tl.where(greedy, 1.0, t)
    cutoff = tl.load(cutoff_ptr + row)  # in logit units; -inf when top-k and top-p are off
    min_p = tl.load(min_p_ptr + row)
    seed = tl.load(seeds_ptr + row)
    step = tl.load(steps_ptr + row).to(tl.int64)
    lanes = tl.arange(0, BLOCK_V)

    # min-p: s must reach max(s) + log(min_p). The max needs its own pass over the row, so the
    # pass runs only for sampled rows with min_p; otherwise it has no trips and the floor is -inf.
    max_pass_end = tl.where((min_p > 0.0) & (t > greedy_eps), vocab, 0)
    row_max = tl.full([BLOCK_V], float("-inf"), tl.float32)
    for v0 in range(0, max_pass_end, BLOCK_V):
        x = tl.load(base + v0 + lanes, mask=v0 + lanes < vocab, other=float("-inf"))
        row_max = tl.maximum(row_max, x.to(tl.float32) / t)
    s_floor = tl.max(row_max, axis=0) + tl.log(tl.maximum(min_p, 1e-30))

    best = tl.full([BLOCK_V], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK_V], tl.int32)
    for v0 in range(0, vocab, BLOCK_V):
        idx = v0 + lanes
        valid = idx < vocab
        x = tl.load(base + idx, mask=valid, other=float("-inf")).to(tl.float32)
        s = x / t
        u = tl.rand(seed, (step << 32) + idx.to(tl.int64))
        keep = valid & (x >= cutoff) & (s >= s_floor)
        race = tl.where(keep, s - tl.log(-tl.log(u)), float("-inf"))
        score = tl.where(greedy, x, race)
        better = score > best  # strict: each lane keeps its first maximum
        best_idx = tl.where(better, idx, best_idx)
        best = tl.where(better, score, best)
    top = tl.max(best, axis=0)
    winner = tl.min(tl.where(best == top, best_idx, vocab), axis=0)  # first index among equals
    tl.store(out_ptr + row, tl.minimum(winner, vocab - 1).to(tl.int64))


def logit_cutoffs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                  top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Per row, the smallest logit that survives min-p, top-k and then top-p; -inf where top-k
    and top-p are both off (min-p alone is left to the kernel's own pass)."""
    x = logits.float()
    vocab = x.shape[-1]
    t = torch.where(temperature <= GREEDY_EPS, 1.0, temperature.float())
    sorted_x = torch.sort(x, dim=-1, descending=True).values
    sorted_s = sorted_x / t[:, None]
    k = top_k.long()
    kth = sorted_x.gather(1, (k.clamp(1, vocab) - 1)[:, None]).squeeze(1)
    cut_k = torch.where((k > 0) & (k < vocab), kth, float("-inf"))
    s_floor = sorted_s[:, :1] + torch.log(min_p.float())[:, None]  # -inf where min_p is 0
    alive = (sorted_x >= cut_k[:, None]) & (sorted_s >= s_floor)
    probs = torch.softmax(torch.where(alive, sorted_s, float("-inf")), dim=-1)
    mass_before = probs.cumsum(-1) - probs
    count = (mass_before < top_p.float()[:, None]).sum(-1).clamp(1, vocab)
    nucleus_floor = sorted_x.gather(1, (count - 1)[:, None]).squeeze(1)
    cut_p = torch.where(top_p < 1.0, nucleus_floor, float("-inf"))
    return torch.maximum(cut_k, cut_p)


def sample(
    logits: torch.Tensor,  # [num_seqs, vocab], any float dtype
    temperature: torch.Tensor,  # [num_seqs] float32
    top_k: torch.Tensor,  # [num_seqs] int32
    top_p: torch.Tensor,  # [num_seqs] float32
    min_p: torch.Tensor,  # [num_seqs] float32
    seeds: torch.Tensor,  # [num_seqs] int64
    steps: torch.Tensor,  # [num_seqs] int64
    *,
    all_greedy: bool = False,
    need_cutoffs: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sampled ids, int64 [num_seqs], still on the device. Hints: all_greedy (every temperature is
    0) skips everything but the argmax; need_cutoffs=False (no row uses top-k or top-p) skips the
    sort. Both are host-side facts of the batch, so neither costs a sync."""
    assert logits.stride(-1) == 1
    num_seqs, vocab = logits.shape
    if all_greedy:
        return torch.argmax(logits, dim=-1, out=out)
    if need_cutoffs:
        cutoffs = logit_cutoffs(logits, temperature, top_k, top_p, min_p)
    else:
        cutoffs = torch.full((num_seqs,), float("-inf"), dtype=torch.float32, device=logits.device)
    if out is None:
        out = torch.empty(num_seqs, dtype=torch.int64, device=logits.device)
    if num_seqs > 0:
        _sample_kernel[(num_seqs,)](
            logits, logits.stride(0), temperature, cutoffs, min_p, seeds, steps, out,
            vocab, GREEDY_EPS, BLOCK_V=min(BLOCK_V, triton.next_power_of_2(vocab)), num_warps=4,
        )
    return out
