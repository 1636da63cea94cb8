"""Triton fused mixture-of-experts: tokens sorted by expert, then two grouped GEMMs.

1. Route (the caller: softmax and top-k, moe_route.py) gives each token k (expert, weight) pairs.
   `align_by_expert` (moe_align.py) groups the T * k pairs by expert and pads every expert's run
   to a multiple of BLOCK_M, so each BLOCK_M-row tile of the list belongs to one expert. It runs on
   fixed-size buffers with no host sync, so a decode step stays capturable.
2. Grouped GEMM 1: a tile's rows gather their tokens' hidden states and multiply them by that
   expert's gate and up rows, in two accumulators, so the activation, act(gate) * up, is applied
   before anything goes to memory: only the [pairs, inter] activation is written.
3. Grouped GEMM 2: the activation times the expert's down projection, scaled by the pair's routing
   weight; the k rows of each token are then summed.

Experts not routed to cost nothing but a program that returns at once; tiles past the padded end
likewise.

FP8 experts (float8_e4m3fn w13/w2 with one float32 scale per expert and output row, a per-tensor
scale repeated) take the same kernels with W_FP8 set:
- weight-only (W8A16): each weight tile is widened to the activation's dtype in registers, the
  tile product accumulates in fp32, and the row scales multiply the accumulator once at the end
  (a scale per output channel factors out of the K sum, so this equals x @ (q * scale)^T);
- W8A8 (A_FP8 too): the GEMM's input arrives quantized to e4m3 with one float32 scale per row (per
  token for gate_up; per (token, expert) row for down), tl.dot multiplies e4m3 by e4m3 (Hopper's
  FP8 MMA) and the accumulator is scaled by the row's and the output channel's scales.
Neither has been timed on a GPU yet (e2e/moe_fp8_gpu_bench.py is the bench); both are tested under
the interpreter against fused_moe_fp8_ref.

Under tensor parallelism each rank holds a slice of every expert's inter dimension (gate and up by
rows, down by columns), so its output is a partial sum that the layer all-reduces. Expert
parallelism (whole experts per rank) is not done yet.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagoda.kernels.activation import gated_activation
from pagoda.kernels.attention_dot import _dot, dot_precision
from pagoda.kernels.moe_align import align_by_expert
from pagoda.kernels.moe_tiles import tuned_tile
from pagoda.kernels.quant_fp8_ref import FP8_DTYPE, FP8_MAX, MIN_SCALE


@triton.jit
def _fp8_dot(a, w, PRECISION: tl.constexpr, W_FP8: tl.constexpr, A_FP8: tl.constexpr):
    """a @ w in fp32: e4m3 by e4m3 (W8A8), e4m3 weights widened to a's dtype (W8A16; exact), or
    the unquantized product. The scales are the caller's, once per tile."""
    if A_FP8:
        return tl.dot(a, w)
    elif W_FP8:
        return _dot(a, w.to(a.dtype), PRECISION)
    else:
        return _dot(a, w, PRECISION)


@triton.jit
def _gate_up_kernel(
    x_ptr, w13_ptr, out_ptr, sorted_ptr, block_expert_ptr, w_scale_ptr, a_scale_ptr,
    num_pairs, hidden, inter,
    stride_xt, stride_we, stride_wn, stride_ot, stride_se,
    TOP_K: tl.constexpr, ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
    W_FP8: tl.constexpr, A_FP8: tl.constexpr,
):
    pid_m = tl.program_id(0)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert >= 0:
        pairs = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = pairs < num_pairs
        tokens = (pairs // TOP_K).to(tl.int64)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = n < inter
        w = w13_ptr + expert.to(tl.int64) * stride_we
        acc_gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, hidden, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            kmask = k < hidden
            a = tl.load(x_ptr + tokens[:, None] * stride_xt + k[None, :],
                        mask=valid[:, None] & kmask[None, :], other=0.0)
            wmask = kmask[:, None] & nmask[None, :]
            wg = tl.load(w + n[None, :].to(tl.int64) * stride_wn + k[:, None], mask=wmask, other=0.0)
            wu = tl.load(w + (inter + n[None, :]).to(tl.int64) * stride_wn + k[:, None], mask=wmask, other=0.0)
            acc_gate += _fp8_dot(a, wg, PRECISION, W_FP8, A_FP8)
            acc_up += _fp8_dot(a, wu, PRECISION, W_FP8, A_FP8)
        if W_FP8:  # the output channels' scales, then (W8A8) the tokens'
            scales = w_scale_ptr + expert.to(tl.int64) * stride_se
            acc_gate *= tl.load(scales + n, mask=nmask, other=0.0)[None, :]
            acc_up *= tl.load(scales + inter + n, mask=nmask, other=0.0)[None, :]
            if A_FP8:
                token_scale = tl.load(a_scale_ptr + tokens, mask=valid, other=0.0)[:, None]
                acc_gate *= token_scale
                acc_up *= token_scale
        # Round as the reference does: each projection, then the activation, in the model dtype.
        dtype = out_ptr.dtype.element_ty
        h = gated_activation(acc_gate, acc_up, dtype, ACTIVATION)
        tl.store(out_ptr + pairs[:, None].to(tl.int64) * stride_ot + n[None, :], h.to(dtype),
                 mask=valid[:, None] & nmask[None, :])


@triton.jit
def _down_kernel(
    h_ptr, w2_ptr, weights_ptr, out_ptr, sorted_ptr, block_expert_ptr, w_scale_ptr, a_scale_ptr,
    num_pairs, hidden, inter,
    stride_ht, stride_we, stride_wn, stride_ot, stride_se,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
    W_FP8: tl.constexpr, A_FP8: tl.constexpr,
):
    pid_m = tl.program_id(0)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert >= 0:
        pairs = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = pairs < num_pairs
        rows = pairs.to(tl.int64)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = n < hidden
        w = w2_ptr + expert.to(tl.int64) * stride_we
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            kmask = k < inter
            a = tl.load(h_ptr + rows[:, None] * stride_ht + k[None, :], mask=valid[:, None] & kmask[None, :],
                        other=0.0)
            b = tl.load(w + n[None, :].to(tl.int64) * stride_wn + k[:, None],
                        mask=kmask[:, None] & nmask[None, :], other=0.0)
            acc += _fp8_dot(a, b, PRECISION, W_FP8, A_FP8)
        if W_FP8:
            acc *= tl.load(w_scale_ptr + expert.to(tl.int64) * stride_se + n, mask=nmask, other=0.0)[None, :]
            if A_FP8:
                acc *= tl.load(a_scale_ptr + rows, mask=valid, other=0.0)[:, None]
        dtype = out_ptr.dtype.element_ty
        weight = tl.load(weights_ptr + rows, mask=valid, other=0.0).to(tl.float32)
        y = acc.to(dtype).to(tl.float32) * weight[:, None]
        tl.store(out_ptr + rows[:, None] * stride_ot + n[None, :], y.to(dtype),
                 mask=valid[:, None] & nmask[None, :])


def default_config(num_pairs: int, num_experts: int, device: torch.device) -> dict:
    """Tiles where moe_tiles.json has none for this GPU and shape: small for decode-sized batches
    (few rows per expert), larger for prefill; first guesses (the engine's --moe-tile overrides
    both for a hand sweep, through fused_moe's config). Small under the interpreter so the CPU
    tests stay quick."""
    if device.type != "cuda":
        return dict(block_m=16, block_n=16, block_k=16, num_warps=1, num_stages=1)
    if num_pairs <= 4 * num_experts:  # under ~4 rows per expert: each expert's weights are one stream
        return dict(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4)
    if num_pairs <= 32 * num_experts:
        return dict(block_m=32, block_n=64, block_k=128, num_warps=4, num_stages=3)
    return dict(block_m=64, block_n=128, block_k=64, num_warps=8, num_stages=3)


def fused_moe(
    x: torch.Tensor,  # [T, hidden]
    w13: torch.Tensor,  # [E, 2 * inter, hidden]
    w2: torch.Tensor,  # [E, hidden, inter]
    topk_weights: torch.Tensor,  # [T, k]
    topk_ids: torch.Tensor,  # [T, k]
    activation: str = "silu",
    *,
    w13_scale: torch.Tensor | None = None,  # [E, 2 * inter] float32, with e4m3 w13
    w2_scale: torch.Tensor | None = None,  # [E, hidden] float32, with e4m3 w2
    activations: str = "none",  # FP8 experts: "none" (W8A16) or how W8A8 quantizes each GEMM's input
    a13_scale: torch.Tensor | None = None,  # static-tensor: the checkpoint's input scales ([] float32)
    a2_scale: torch.Tensor | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """Same contract as fused_moe_ref; with FP8 experts (w13_scale and w2_scale given), as
    fused_moe_fp8_ref."""
    num_tokens, hidden = x.shape
    num_experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    top_k = topk_ids.shape[1]
    num_pairs = num_tokens * top_k
    if num_tokens == 0:
        return torch.zeros_like(x)
    assert x.stride(-1) == 1 and w13.stride(-1) == 1 and w2.stride(-1) == 1
    w_fp8 = w13_scale is not None
    a_fp8 = w_fp8 and activations != "none"
    if w_fp8:
        assert w13.dtype == w2.dtype == FP8_DTYPE and w2_scale is not None, "FP8 experts: e4m3 w13 and w2, both scales"
        assert w13_scale.shape == (num_experts, two_inter) and w2_scale.shape == (num_experts, hidden)
        assert w13_scale.stride(1) == 1 and w2_scale.stride(1) == 1
    if config is None:
        config = tuned_tile(num_tokens, num_experts, hidden, inter, w13.dtype, x.device)
    cfg = config or default_config(num_pairs, num_experts, x.device)
    bm = cfg["block_m"]
    sorted_pairs, block_expert = align_by_expert(topk_ids, num_experts, bm)
    launch = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    precision = dot_precision(x)
    # never read unless FP8 (W_FP8, A_FP8 constexprs): any float32 tensor will do
    w13_s, w2_s = (w13_scale, w2_scale) if w_fp8 else (topk_weights, topk_weights)
    a_in, x_scale = (_quantize_input(x, activations, a13_scale)) if a_fp8 else (x, topk_weights)
    h = torch.empty(num_pairs, inter, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(block_expert.numel(), triton.cdiv(inter, cfg["block_n"]))](
        a_in, w13, h, sorted_pairs, block_expert, w13_s, x_scale,
        num_pairs, hidden, inter,
        a_in.stride(0), w13.stride(0), w13.stride(1), h.stride(0), w13_s.stride(0),
        TOP_K=top_k, ACTIVATION=activation,
        BLOCK_M=bm, BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"], PRECISION=precision,
        W_FP8=w_fp8, A_FP8=a_fp8, **launch,
    )
    h_in, h_scale = _quantize_input(h, activations, a2_scale) if a_fp8 else (h, topk_weights)
    y = torch.empty(num_pairs, hidden, dtype=x.dtype, device=x.device)
    weights = topk_weights.reshape(-1).contiguous()
    _down_kernel[(block_expert.numel(), triton.cdiv(hidden, cfg["block_n"]))](
        h_in, w2, weights, y, sorted_pairs, block_expert, w2_s, h_scale,
        num_pairs, hidden, inter,
        h_in.stride(0), w2.stride(0), w2.stride(1), y.stride(0), w2_s.stride(0),
        BLOCK_M=bm, BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"], PRECISION=precision,
        W_FP8=w_fp8, A_FP8=a_fp8, **launch,
    )
    # k rows per token, summed in fp32 (transformers adds them one expert at a time)
    return y.view(num_tokens, top_k, hidden).sum(dim=1, dtype=torch.float32).to(x.dtype)


def _quantize_input(x: torch.Tensor, activations: str, static_scale: torch.Tensor | None):
    """(q e4m3 [M, K], scale float32 [M], contiguous) for a W8A8 GEMM: quantize_moe_activation_ref's
    arithmetic, on the Triton quantization kernel. A per-tensor dynamic scale is one device
    reduction first (no host sync)."""
    from pagoda.kernels.quant_fp8 import quantize_fp8  # here: the tests' conftest may reload it

    if activations == "dynamic-token":
        q, scale = quantize_fp8(x)
    elif activations == "dynamic-tensor":
        q, scale = quantize_fp8(x, (x.abs().amax().float() / FP8_MAX).clamp(min=MIN_SCALE))
    elif activations == "static-tensor":
        q, scale = quantize_fp8(x, static_scale.float())
    else:
        raise ValueError(f"FP8 MoE activations {activations!r}: use none, dynamic-token, dynamic-tensor or "
                         "static-tensor")
    return q, scale.reshape(-1).contiguous()
