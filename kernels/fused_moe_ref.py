"""Reference mixture-of-experts: route each token to its top-k experts, run each expert's gated MLP
on its tokens, and sum the outputs weighted by the routing weights, as transformers does.

Expert weights are stacked: w13 is [num_experts, 2 * inter, hidden] (gate rows, then up rows) and
w2 is [num_experts, hidden, inter]. Under tensor parallelism inter is this rank's share, and the
caller all-reduces the partial sums.
"""

import torch
import torch.nn.functional as F


def route_ref(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights [T, k] in the logits' dtype, topk_ids [T, k] int64): softmax in fp32, the top k,
    renormalised to sum to one if asked (Mixtral always; Qwen3-MoE when norm_topk_prob)."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids


def align_by_expert_ref(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted_pairs, block_expert). sorted_pairs [capacity] int32 lists pair indices (token * k +
    slot) grouped by expert, each group padded to a multiple of block_m with the sentinel
    num_pairs; block_expert [capacity // block_m] int32 is each tile's expert, -1 past the end.
    capacity is the worst case, num_pairs + min(num_experts, num_pairs) * (block_m - 1), rounded up
    to block_m, so the shapes depend only on the batch size."""
    flat = topk_ids.reshape(-1)
    num_pairs, dev = flat.numel(), flat.device
    capacity = -(-(num_pairs + min(num_experts, num_pairs) * (block_m - 1)) // block_m) * block_m
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    # rank of each sorted pair within its expert's run, then its slot in the padded list
    count_end = torch.cumsum(counts, 0)
    rank = torch.arange(num_pairs, device=dev) - (count_end - counts)[sorted_experts]
    dest = (padded_end - padded)[sorted_experts] + rank
    sorted_pairs = torch.full((capacity,), num_pairs, dtype=torch.int32, device=dev)
    sorted_pairs[dest] = order.to(torch.int32)
    starts = torch.arange(0, capacity, block_m, device=dev)
    block_expert = torch.searchsorted(padded_end, starts, right=True)
    block_expert = torch.where(starts < padded_end[-1], block_expert, -1).to(torch.int32)
    return sorted_pairs, block_expert


def act_and_mul_ref(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    if activation == "silu":
        return F.silu(gate) * up
    if activation == "gelu_tanh":
        return F.gelu(gate, approximate="tanh") * up
    raise ValueError(f"activation {activation!r} is not supported; use silu or gelu_tanh")


def fused_moe_ref(
    x: torch.Tensor,  # [T, hidden]
    w13: torch.Tensor,  # [E, 2 * inter, hidden]
    w2: torch.Tensor,  # [E, hidden, inter]
    topk_weights: torch.Tensor,  # [T, k]
    topk_ids: torch.Tensor,  # [T, k]
    activation: str = "silu",
) -> torch.Tensor:
    out = torch.zeros_like(x)
    for expert in torch.unique(topk_ids).tolist():
        token, slot = torch.where(topk_ids == expert)
        h = act_and_mul_ref(F.linear(x[token], w13[expert]), activation)
        y = F.linear(h, w2[expert]) * topk_weights[token, slot, None]
        out.index_add_(0, token, y.to(out.dtype))
    return out


def quantize_moe_activation_ref(x: torch.Tensor, activations: str, static_scale: torch.Tensor | None = None
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] as the FP8 experts' W8A8 path quantizes a GEMM's input: (q e4m3, scale [M] float32),
    per row ("dynamic-token"), by one amax over all of x ("dynamic-tensor") or by the checkpoint's
    static per-tensor scale ("static-tensor")."""
    from pagoda.kernels.quant_fp8_ref import FP8_MAX, MIN_SCALE, quantize_fp8_ref

    if activations == "dynamic-token":
        q, scale = quantize_fp8_ref(x)
    elif activations == "dynamic-tensor":
        q, scale = quantize_fp8_ref(x, (x.float().abs().amax() / FP8_MAX).clamp(min=MIN_SCALE))
    elif activations == "static-tensor":
        q, scale = quantize_fp8_ref(x, static_scale)
    else:
        raise ValueError(f"FP8 MoE activations {activations!r}: use dynamic-token, dynamic-tensor or static-tensor")
    return q, scale.reshape(-1)


def fused_moe_fp8_ref(
    x: torch.Tensor,  # [T, hidden]
    w13: torch.Tensor,  # [E, 2 * inter, hidden] float8_e4m3fn
    w2: torch.Tensor,  # [E, hidden, inter] float8_e4m3fn
    w13_scale: torch.Tensor,  # [E, 2 * inter] float32: one per output row (a per-tensor scale repeated)
    w2_scale: torch.Tensor,  # [E, hidden] float32
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
    activations: str = "none",
    a13_scale: torch.Tensor | None = None,
    a2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """fused_moe_ref with e4m3 expert weights, y = x @ (q * scale)^T, in fp32. activations "none":
    weight-only (W8A16), x as it is. Otherwise (W8A8) each GEMM's input is first replaced by its FP8
    round trip (quantize_moe_activation_ref): x once for every expert, and the activation
    act(gate) * up, rounded to x's dtype, per (token, expert) row. Returns x's dtype."""
    w13d = w13.float() * w13_scale.float()[..., None]
    w2d = w2.float() * w2_scale.float()[..., None]
    xf = x.float()
    if activations != "none":
        q, scale = quantize_moe_activation_ref(x, activations, a13_scale)
        xf = q.float() * scale[:, None]
    num_tokens, top_k = topk_ids.shape
    # one row per (token, slot) pair, as the kernel lays them out
    pairs_expert = topk_ids.reshape(-1)
    h = torch.zeros(num_tokens * top_k, w2.shape[2], device=x.device)
    for expert in torch.unique(pairs_expert).tolist():
        rows = torch.where(pairs_expert == expert)[0]
        gate, up = F.linear(xf[rows // top_k], w13d[expert]).to(x.dtype).float().chunk(2, dim=-1)
        act = act_and_mul_ref(torch.cat([gate, torch.ones_like(up)], dim=-1), activation)  # act(gate)
        h[rows] = (act.to(x.dtype).float() * up).to(x.dtype).float()  # rounded where the kernel rounds
    if activations != "none":
        q, scale = quantize_moe_activation_ref(h.to(x.dtype), activations, a2_scale)
        h = q.float() * scale[:, None]
    y = torch.zeros(num_tokens * top_k, w2.shape[1], device=x.device)
    for expert in torch.unique(pairs_expert).tolist():
        rows = torch.where(pairs_expert == expert)[0]
        y[rows] = F.linear(h[rows], w2d[expert]).to(x.dtype).float()
    y = y * topk_weights.reshape(-1, 1).float()
    return y.to(x.dtype).float().view(num_tokens, top_k, -1).sum(dim=1).to(x.dtype)
