"""A mixture-of-experts feed-forward: a router, then the experts' gated MLPs in one fused call.

The experts' weights are stacked ([experts, 2 * inter, hidden] for gate|up, [experts, hidden,
inter] for down) so one grouped GEMM serves them all (pagoda.kernels.fused_moe). Tensor
parallelism splits every expert's intermediate dimension, as a dense MLP's: gate and up by rows,
down by columns, then one all-reduce. Expert parallelism (whole experts per rank) would cut the
all-reduce traffic at large sizes; it is not done yet.

With FP8 experts (pagoda.runtime.quantization.fp8_moe) w13 and w2 are e4m3 and the block also holds
their row scales (w13_weight_scale [E, 2 * inter], w2_weight_scale [E, hidden]) and, for static
activations, one input scale per GEMM; the scale loaders put each checkpoint matrix's scales (per
tensor or per channel) on its rows of this rank's slice.
"""

from __future__ import annotations

import torch
from torch import nn

from pagoda.kernels import ops
from pagoda.runtime.layers.linear import ReplicatedLinear
from pagoda.runtime.layers.parallel_state import current_tp, divide
from pagoda.runtime.layers.weight_slice import materialize, narrow, shape_of
from pagoda.runtime.quantization import fp8_moe

# transformers 5's in-memory names of all experts' matrices -> our parameter
STACKED_EXPERTS = {"gate_up_proj": "w13", "down_proj": "w2"}
# checkpoint names of one expert's three matrices -> (our parameter, part); part 0 = gate, 1 = up
EXPERT_PARTS = {
    "w1": ("w13", 0), "w3": ("w13", 1), "w2": ("w2", None),  # Mixtral
    "gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", None),  # Qwen3-MoE
}


class FusedMoE(nn.Module):
    # the checkpoint's names of one expert's (gate, up, down) matrices, under experts.N.
    expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 renormalize: bool, activation: str = "silu"):
        super().__init__()
        self.tp = current_tp()
        self.top_k, self.renormalize, self.activation = top_k, renormalize, activation
        self.inter = divide(intermediate_size, self.tp.size)  # this rank's share of each expert
        self.num_experts = num_experts
        self.fp8 = None  # the FP8Scheme when the experts are FP8 (quantization/fp8_moe.py)
        self.gate = ReplicatedLinear(hidden_size, num_experts)  # the router
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * self.inter, hidden_size), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, self.inter), requires_grad=False)
        self.w13.weight_loader = self.w2.weight_loader = self.expert_loader

    def expert_loader(self, param: nn.Parameter, loaded, expert: int, part: int | None) -> None:
        """One expert's gate, up ([inter, hidden]) or down ([hidden, inter]) matrix, this rank's rows
        or columns of it."""
        start = self.tp.rank * self.inter
        if part is None:
            param.data[expert].copy_(narrow(loaded, 1, start, self.inter))
        else:
            param.data[expert, part * self.inter : (part + 1) * self.inter].copy_(narrow(loaded, 0, start, self.inter))

    def expert_scale_loader(self, param: nn.Parameter, loaded, expert: int, part: int | None) -> None:
        """One expert matrix's weight_scale onto its rows: one value (per tensor) fills them; per
        channel ([rows] or [rows, 1]), gate's and up's are cut to this rank's rows, down's (its
        rows are hidden, not split) taken whole."""
        rows = param.data[expert] if part is None else param.data[expert, part * self.inter : (part + 1) * self.inter]
        if len(shape_of(loaded)) == 0 or shape_of(loaded)[0] == 1:
            rows.copy_(materialize(loaded).float().reshape(1).expand(rows.shape[0]))
        elif part is None:
            rows.copy_(materialize(loaded).float().reshape(rows.shape[0]))
        else:
            rows.copy_(narrow(loaded, 0, self.tp.rank * self.inter, self.inter).float().reshape(self.inter))

    def expert_input_scale_loader(self, param: nn.Parameter, loaded, expert: int, part: int | None) -> None:
        # every expert's static input scale of one GEMM: the largest covers them all (vLLM's choice)
        param.data.copy_(torch.maximum(param.data, materialize(loaded).float().reshape(())))

    def stacked_loader(self, param: nn.Parameter, loaded, name: str) -> None:
        """All experts at once, as transformers 5 holds them in memory: gate_up_proj [E, 2 * inter,
        hidden] (gate rows, then up rows) or down_proj [E, hidden, inter]."""
        start, size = self.tp.rank * self.inter, self.inter
        if name == "down_proj":
            param.data.copy_(narrow(loaded, 2, start, size))
            return
        full = shape_of(loaded)[1] // 2
        for part in (0, 1):
            param.data[:, part * size : (part + 1) * size].copy_(narrow(loaded, 1, part * full + start, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = ops.moe_route(self.gate(x), self.top_k, self.renormalize)
        if self.fp8 is not None and self.w13.dtype == torch.float8_e4m3fn:
            return self.tp.all_reduce(fp8_moe.apply(self, x, weights, ids))
        return self.tp.all_reduce(ops.fused_moe(x, self.w13, self.w2, weights, ids, self.activation))

    @staticmethod
    def expert_checkpoint_shapes(p: str, hidden: int, inter: int, num_experts: int,
                          names: tuple[str, str, str]) -> list[tuple[str, tuple[int, ...]]]:
        """names: the checkpoint's (gate, up, down) names, under p + 'experts.N.'."""
        shapes = [(p + "gate.weight", (num_experts, hidden))]
        for e in range(num_experts):
            gate, up, down = (f"{p}experts.{e}.{n}.weight" for n in names)
            shapes += [(gate, (inter, hidden)), (up, (inter, hidden)), (down, (hidden, inter))]
        return shapes
