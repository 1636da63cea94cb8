"""MoE routing in one Triton kernel: softmax over the experts in fp32, the top k, renormalised.

fused_moe_ref.route_ref is five torch ops (softmax, topk, sum, divide, cast), each its own kernel
in every MoE layer of every step. Here each program holds BLOCK_T tokens' router logits in
registers and picks the k largest probabilities one at a time (a max, then the lowest expert
index holding it, then that expert masked out), so the k come out in descending order as
torch.topk gives them; exact ties go to the lower expert index, where torch leaves it unspecified.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _route_kernel(logits_ptr, weights_ptr, ids_ptr, num_tokens, num_experts, stride_t,
                  TOP_K: tl.constexpr, K_PAD: tl.constexpr, RENORMALIZE: tl.constexpr,
                  E_PAD: tl.constexpr, BLOCK_T: tl.constexpr):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    e = tl.arange(0, E_PAD)
    tmask, emask = t < num_tokens, e < num_experts
    x = tl.load(logits_ptr + t[:, None].to(tl.int64) * stride_t + e[None, :],
                mask=tmask[:, None] & emask[None, :], other=0.0).to(tl.float32)
    x = tl.where(emask[None, :], x, float("-inf"))  # padding experts get probability 0
    p = tl.exp(x - tl.max(x, axis=1)[:, None])
    p = p / tl.sum(p, axis=1)[:, None]
    p = tl.where(emask[None, :], p, -1.0)  # ... and are never picked
    slot = tl.arange(0, K_PAD)
    weights = tl.zeros([BLOCK_T, K_PAD], tl.float32)
    ids = tl.zeros([BLOCK_T, K_PAD], tl.int32)
    total = tl.zeros([BLOCK_T], tl.float32)
    for j in tl.static_range(TOP_K):
        best = tl.max(p, axis=1)
        pick = tl.min(tl.where(p == best[:, None], e[None, :], E_PAD), axis=1)
        weights = tl.where(slot[None, :] == j, best[:, None], weights)
        ids = tl.where(slot[None, :] == j, pick[:, None], ids)
        total += best
        p = tl.where(e[None, :] == pick[:, None], -1.0, p)
    if RENORMALIZE:
        weights = weights / total[:, None]
    out = t[:, None].to(tl.int64) * TOP_K + slot[None, :]
    omask = tmask[:, None] & (slot[None, :] < TOP_K)
    tl.store(weights_ptr + out, weights.to(weights_ptr.dtype.element_ty), mask=omask)
    tl.store(ids_ptr + out, ids.to(tl.int64), mask=omask)


def moe_route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """As fused_moe_ref.route_ref: (topk_weights [T, k] in the logits' dtype, topk_ids [T, k]
    int64)."""
    num_tokens, num_experts = router_logits.shape
    assert router_logits.stride(1) == 1 and top_k <= num_experts
    weights = torch.empty(num_tokens, top_k, dtype=router_logits.dtype, device=router_logits.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int64, device=router_logits.device)
    if num_tokens == 0:
        return weights, ids
    e_pad = triton.next_power_of_2(num_experts)
    block_t = max(1, min(16, 4096 // e_pad))
    _route_kernel[(triton.cdiv(num_tokens, block_t),)](
        router_logits, weights, ids, num_tokens, num_experts, router_logits.stride(0),
        TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k), RENORMALIZE=renormalize, E_PAD=e_pad, BLOCK_T=block_t,
        num_warps=4,
    )
    return weights, ids
