"""Linear layers in Megatron's column- and row-parallel shapes.

A column-parallel layer splits its output features across ranks, a row-parallel one its input
features (followed by an all-reduce). The attention block is column (qkv) then row (o_proj), the
MLP column (gate_up) then row (down), so a whole block needs one all-reduce per half. Each
parameter carries a weight_loader that cuts this rank's slice out of a checkpoint tensor (or a
lazy safetensors slice, so only that slice is read from disk).
"""

from __future__ import annotations

import torch
from torch import nn

from pagoda.kernels import ops
from pagoda.runtime.layers.parallel_state import current_tp, divide, get_tp_size, kv_heads_per_rank
from pagoda.runtime.layers.weight_slice import materialize, narrow, shape_of


class LinearBase(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, tp_dim: int | None):
        super().__init__()
        self.tp = current_tp()
        self.tp_rank, self.tp_size, self.tp_dim = self.tp.rank, self.tp.size, tp_dim
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        if self.tp_dim is not None and self.tp_dim < len(shape_of(loaded)):
            size = param.shape[self.tp_dim]
            param.data.copy_(narrow(loaded, self.tp_dim, self.tp_rank * size, size))
        else:
            param.data.copy_(materialize(loaded))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias)


class ReplicatedLinear(LinearBase):
    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__(in_features, out_features, bias, tp_dim=None)


class ColumnParallelLinear(LinearBase):
    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__(in_features, divide(out_features, get_tp_size()), bias, tp_dim=0)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul (gate and up): shard_id is the part's index."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False):
        self.output_sizes = output_sizes
        super().__init__(in_features, sum(output_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: int) -> None:
        offset = divide(sum(self.output_sizes[:shard_id]), self.tp_size)
        size = divide(self.output_sizes[shard_id], self.tp_size)
        param.data.narrow(0, offset, size).copy_(narrow(loaded, 0, self.tp_rank * size, size))


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matmul; each rank holds its share of the heads of each."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool):
        tp = get_tp_size()
        self.head_dim = head_dim
        self.num_heads = divide(num_heads, tp)
        # With more ranks than KV heads, each rank keeps a replica of one KV head: ranks
        # kv_replicas * j .. kv_replicas * (j + 1) - 1 all hold KV head j, which their q heads use.
        self.num_kv_heads = kv_heads_per_rank(num_kv_heads, tp)
        self.kv_replicas = max(1, tp // num_kv_heads)
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp
        super().__init__(hidden_size, out, bias)

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: str) -> None:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        offset, size = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}[shard_id]
        rank = self.tp_rank if shard_id == "q" else self.tp_rank // self.kv_replicas
        param.data.narrow(0, offset, size).copy_(narrow(loaded, 0, rank * size, size))


class RowParallelLinear(LinearBase):
    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__(divide(in_features, get_tp_size()), out_features, bias, tp_dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The bias is added once, after the partial sums are reduced.
        y = ops.linear(x, self.weight, self.bias if self.tp_rank == 0 else None)
        return self.tp.all_reduce(y)

    def forward_silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """forward(silu(gate) * up) from the MLP's merged gate|up output; at decode's few rows one
        kernel does both, and the activation never goes through memory."""
        y = ops.silu_and_mul_linear(gate_up, self.weight, self.bias if self.tp_rank == 0 else None)
        return self.tp.all_reduce(y)
