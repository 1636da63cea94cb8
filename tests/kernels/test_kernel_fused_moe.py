"""The fused MoE Triton kernels (expert sort, gate_up with the activation fused, down with the
routing weight) against the torch reference, under TRITON_INTERPRET=1, and the reference against
transformers' own MoE block."""

import pytest
import torch
from kernel_testing import tolerance

from pagoda.kernels.fused_moe import fused_moe
from pagoda.kernels.fused_moe_ref import fused_moe_ref, route_ref
from pagoda.kernels.moe_align import align_by_expert


def moe_inputs(num_tokens, hidden, inter, num_experts, top_k, dtype, only=None):
    x = torch.randn(num_tokens, hidden).to(dtype)
    w13 = (torch.randn(num_experts, 2 * inter, hidden) * hidden**-0.5).to(dtype)
    w2 = (torch.randn(num_experts, hidden, inter) * inter**-0.5).to(dtype)
    logits = torch.randn(num_tokens, num_experts)
    if only is not None:  # route only to these experts: the others must cost nothing and write nothing
        mask = torch.full((num_experts,), float("-inf"))
        mask[only] = 0.0
        logits = logits + mask
    weights, ids = route_ref(logits.to(dtype), top_k, renormalize=True)
    return x, w13, w2, weights, ids


@pytest.mark.parametrize("num_tokens,top_k,num_experts,only", [(1, 2, 4, None), (7, 2, 5, [0, 3]), (33, 3, 6, None)])
def test_align_by_expert_groups_every_pair_once(num_tokens, top_k, num_experts, only):
    *_, ids = moe_inputs(num_tokens, 16, 16, num_experts, top_k, torch.float32, only)
    block_m = 16
    sorted_pairs, block_expert = align_by_expert(ids, num_experts, block_m)
    num_pairs = num_tokens * top_k
    real = sorted_pairs[sorted_pairs < num_pairs]
    assert sorted(real.tolist()) == list(range(num_pairs))
    flat = ids.reshape(-1)
    for b, expert in enumerate(block_expert.tolist()):
        tile = sorted_pairs[b * block_m : (b + 1) * block_m]
        tile = tile[tile < num_pairs]
        if expert < 0:
            assert tile.numel() == 0
        else:
            assert tile.numel() > 0 and (flat[tile.long()] == expert).all()
    used = torch.unique(flat)
    assert (block_expert >= 0).sum() == sum(-(-int((flat == e).sum()) // block_m) for e in used.tolist())


@pytest.mark.parametrize(
    "dtype,num_tokens,hidden,inter,num_experts,top_k,activation,only",
    [
        (torch.float32, 1, 32, 16, 4, 2, "silu", None),  # decode: one token
        (torch.float32, 9, 48, 24, 5, 2, "silu", [1, 4]),  # ragged dims; three experts idle
        (torch.bfloat16, 21, 32, 32, 8, 3, "silu", None),
        (torch.float16, 5, 32, 16, 3, 1, "gelu_tanh", None),
    ],
)
def test_fused_moe_matches_reference(dtype, num_tokens, hidden, inter, num_experts, top_k, activation, only):
    x, w13, w2, weights, ids = moe_inputs(num_tokens, hidden, inter, num_experts, top_k, dtype, only)
    got = fused_moe(x, w13, w2, weights, ids, activation)
    assert got.dtype == dtype and got.shape == x.shape
    if dtype == torch.float32:
        torch.testing.assert_close(got, fused_moe_ref(x, w13, w2, weights, ids, activation), **tolerance(dtype))
    else:
        # The reference adds the k expert outputs in the 16-bit dtype, one at a time (as transformers
        # does), the kernel in fp32: both are held to the same 16-bit inputs computed in fp32.
        exact = fused_moe_ref(*(t.float() for t in (x, w13, w2, weights)), ids, activation)
        torch.testing.assert_close(got.float(), exact, **tolerance(dtype))


def test_fused_moe_tensor_parallel_halves_sum_to_the_whole():
    """Each rank holds half of every expert's inter dim (gate and up rows, down columns): the
    two partial outputs add up to the unsplit layer, which the all-reduce does."""
    x, w13, w2, weights, ids = moe_inputs(6, 32, 32, 4, 2, torch.float32)
    inter = w13.shape[1] // 2
    whole = fused_moe(x, w13, w2, weights, ids)
    half = inter // 2
    parts = []
    for rank in range(2):
        rows = slice(rank * half, (rank + 1) * half)
        w13_r = torch.cat([w13[:, :inter][:, rows], w13[:, inter:][:, rows]], dim=1).contiguous()
        parts.append(fused_moe(x, w13_r, w2[:, :, rows].contiguous(), weights, ids))
    torch.testing.assert_close(parts[0] + parts[1], whole, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_reference_matches_transformers_moe_block(norm_topk_prob):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=16, num_experts=6, num_experts_per_tok=3,
                         norm_topk_prob=norm_topk_prob)
    block = Qwen3MoeSparseMoeBlock(cfg).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.3)
        x = torch.randn(1, 11, 32)
        want = block(x)[0] if isinstance(block(x), tuple) else block(x)
        weights, ids = route_ref(torch.nn.functional.linear(x[0], block.gate.weight), 3, norm_topk_prob)
        got = fused_moe_ref(x[0], block.experts.gate_up_proj, block.experts.down_proj, weights, ids)
    torch.testing.assert_close(got, want[0], rtol=1e-5, atol=1e-5)
