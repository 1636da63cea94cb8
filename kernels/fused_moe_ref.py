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
