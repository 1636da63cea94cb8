"""The fused MoE kernels with FP8 (e4m3) experts under TRITON_INTERPRET=1, against the torch
reference fused_moe_fp8_ref: weight-only (W8A16: weights widened in registers, scaled per output
channel) and W8A8 (each GEMM's input quantized per token, per tensor or by a static scale, e4m3 by
e4m3 through tl.dot). The reference itself is held to the bf16 reference on the dequantized weights."""

import pytest
import torch
from kernel_testing import tolerance

from pagoda.kernels.fused_moe import fused_moe
from pagoda.kernels.fused_moe_ref import fused_moe_fp8_ref, fused_moe_ref, route_ref
from pagoda.kernels.quant_fp8_ref import quantize_weight_fp8_ref


def fp8_experts(num_experts, rows, cols):
    """Random expert matrices quantized per output row; rows' magnitudes a decade apart, so a
    scale applied to the wrong row or expert shows."""
    w = torch.randn(num_experts, rows, cols) * cols**-0.5 * torch.logspace(-1, 0, rows)[:, None]
    q, scale = quantize_weight_fp8_ref(w.reshape(-1, cols))
    return q.view(num_experts, rows, cols), scale.view(num_experts, rows)


def fp8_inputs(num_tokens, hidden, inter, num_experts, top_k, dtype):
    x = torch.randn(num_tokens, hidden).to(dtype)
    q13, s13 = fp8_experts(num_experts, 2 * inter, hidden)
    q2, s2 = fp8_experts(num_experts, hidden, inter)
    weights, ids = route_ref(torch.randn(num_tokens, num_experts).to(dtype), top_k, renormalize=True)
    return x, q13, q2, s13, s2, weights, ids


STATIC = dict(a13_scale=torch.tensor(0.02), a2_scale=torch.tensor(0.004))


@pytest.mark.parametrize("dtype,num_tokens,hidden,inter,num_experts,top_k", [
    (torch.float32, 1, 32, 16, 4, 2),  # decode: one token
    (torch.float32, 9, 48, 24, 5, 2),  # ragged dims over several K and N tiles
    (torch.bfloat16, 13, 32, 32, 6, 3),
    (torch.float16, 5, 32, 16, 3, 1),
])
def test_weight_only_fp8_experts_match_reference(dtype, num_tokens, hidden, inter, num_experts, top_k):
    x, q13, q2, s13, s2, weights, ids = fp8_inputs(num_tokens, hidden, inter, num_experts, top_k, dtype)
    got = fused_moe(x, q13, q2, weights, ids, w13_scale=s13, w2_scale=s2)
    want = fused_moe_fp8_ref(x, q13, q2, s13, s2, weights, ids)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got.float(), want.float(), **tolerance(dtype))


@pytest.mark.parametrize("activations", ["dynamic-token", "dynamic-tensor", "static-tensor"])
def test_w8a8_fp8_experts_match_reference(activations):
    """fp32 activations: the kernel's e4m3 products summed in fp32 and scaled after equal the
    reference's dequantized operands multiplied in fp32 (every e4m3 product is exact in fp32)."""
    x, q13, q2, s13, s2, weights, ids = fp8_inputs(9, 48, 24, 5, 2, torch.float32)
    got = fused_moe(x, q13, q2, weights, ids, w13_scale=s13, w2_scale=s2, activations=activations, **STATIC)
    want = fused_moe_fp8_ref(x, q13, q2, s13, s2, weights, ids, activations=activations, **STATIC)
    torch.testing.assert_close(got, want, **tolerance(torch.float32))
    weight_only = fused_moe_fp8_ref(x, q13, q2, s13, s2, weights, ids)
    assert (got - weight_only).abs().max() > 1e-3  # the activations were quantized


def test_w8a8_bf16_stays_within_fp8_rounding_of_reference():
    """In bf16 the activation is rounded to bf16 before it is quantized, and the interpreter
    truncates where the reference rounds: one bf16 ulp can move an element to the next e4m3 value
    (6% apart), so the bound is FP8's, a few percent of the output's scale, not bf16's."""
    x, q13, q2, s13, s2, weights, ids = fp8_inputs(13, 32, 32, 6, 3, torch.bfloat16)
    got = fused_moe(x, q13, q2, weights, ids, w13_scale=s13, w2_scale=s2, activations="dynamic-token")
    want = fused_moe_fp8_ref(x, q13, q2, s13, s2, weights, ids, activations="dynamic-token")
    assert (got.float() - want.float()).abs().max() <= 0.04 * want.float().abs().max()


def test_fp8_reference_is_the_plain_reference_on_dequantized_weights():
    """What the CPU serves (weights dequantized at load, then the bf16/fp32 path) is what the FP8
    kernels compute weight-only: fused_moe_fp8_ref equals fused_moe_ref on q * scale."""
    x, q13, q2, s13, s2, weights, ids = fp8_inputs(11, 32, 16, 4, 2, torch.float32)
    dequantized = (q13.float() * s13[..., None], q2.float() * s2[..., None])
    torch.testing.assert_close(fused_moe_fp8_ref(x, q13, q2, s13, s2, weights, ids),
                               fused_moe_ref(x, *dequantized, weights, ids), rtol=1e-6, atol=1e-6)


def test_fp8_experts_tensor_parallel_halves_sum_to_the_whole():
    """A rank's slice of every expert (gate and up rows with their scales, down columns with all of
    down's row scales) gives a partial sum; two ranks' add up to the unsplit layer."""
    x, q13, q2, s13, s2, weights, ids = fp8_inputs(6, 32, 32, 4, 2, torch.float32)
    inter = q13.shape[1] // 2
    whole = fused_moe(x, q13, q2, weights, ids, w13_scale=s13, w2_scale=s2)
    half = inter // 2
    parts = []
    for rank in range(2):
        rows = torch.cat([torch.arange(rank * half, (rank + 1) * half), inter + torch.arange(rank * half, (rank + 1) * half)])
        parts.append(fused_moe(x, q13[:, rows].contiguous(), q2[:, :, rank * half:(rank + 1) * half].contiguous(),
                               weights, ids, w13_scale=s13[:, rows].contiguous(), w2_scale=s2))
    torch.testing.assert_close(parts[0] + parts[1], whole, rtol=1e-5, atol=1e-5)
