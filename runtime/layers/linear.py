"""Linear layers in Megatron's column- and row-parallel shapes.

A column-parallel layer splits its output features across ranks, a row-parallel one its input
features (followed by an all-reduce). The attention block is column (qkv) then row (o_proj), the
MLP column (gate_up) then row (down), so a whole block needs one all-reduce per half. Each
parameter carries a weight_loader that cuts this rank's slice out of a checkpoint tensor (or a
lazy safetensors slice, so only that slice is read from disk).

With FP8 weights (pagoda.runtime.quantization) a layer also holds one float32 scale per output row
(weight_scale) and, for static activations, a per-tensor input_scale; the scale loaders put each
checkpoint shard's scales (per tensor or per channel) on that shard's rows.
"""

from __future__ import annotations

import torch
from torch import nn

from pagoda.kernels import ops
from pagoda.runtime.layers.parallel_state import current_tp, divide, get_tp_size, kv_heads_per_rank
from pagoda.runtime.layers.weight_slice import materialize, narrow, shape_of
from pagoda.runtime.quantization import fp8_linear, fp8_residual


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
        self.fp8 = None  # the FP8Scheme when this layer's weights are FP8 (quantization/fp8_linear.py)

    def weight_loader(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        if self.tp_dim is not None and self.tp_dim < len(shape_of(loaded)):
            size = param.shape[self.tp_dim]
            param.data.copy_(narrow(loaded, self.tp_dim, self.tp_rank * size, size))
        else:
            param.data.copy_(materialize(loaded))

    def output_rows(self, shard_id=None) -> tuple[int, int, int]:
        """(first row here, rows, first row in the checkpoint tensor) of a shard's output rows."""
        rows = self.weight.shape[0]
        return 0, rows, self.tp_rank * rows if self.tp_dim == 0 else 0

    def scale_loader(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        """A shard's weight_scale: one value (per tensor) fills its rows; per channel, its rows."""
        offset, size, start = self.output_rows(shard_id)
        rows = param.data.narrow(0, offset, size)
        if len(shape_of(loaded)) == 0 or shape_of(loaded)[0] == 1:
            rows.copy_(materialize(loaded).float().reshape(1).expand(size))
        else:
            rows.copy_(narrow(loaded, 0, start, size).float().reshape(size))

    def input_scale_loader(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        # Fused shards share one input: the largest of their static scales covers them all (vLLM's choice).
        param.data.copy_(torch.maximum(param.data, materialize(loaded).float().reshape(())))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fp8 is not None and fp8_linear.is_fp8(self.weight):
            return fp8_linear.apply(self, x, self.bias)
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

    def output_rows(self, shard_id: int) -> tuple[int, int, int]:
        size = divide(self.output_sizes[shard_id], self.tp_size)
        return divide(sum(self.output_sizes[:shard_id]), self.tp_size), size, self.tp_rank * size

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: int) -> None:
        offset, size, start = self.output_rows(shard_id)
        param.data.narrow(0, offset, size).copy_(narrow(loaded, 0, start, size))

    def forward_glu(self, x, activation: str = "silu") -> torch.Tensor | None:
        """act(gate) * up of this gate|up layer's output where one kernel computes both (an FP8
        layer at one row, SiLU only: fp8_linear.glu; a 16-bit layer at many rows with --gemm-glu:
        ops.gemm_glu), else None."""
        if len(self.output_sizes) != 2:
            return None
        if self.fp8 is not None and fp8_linear.is_fp8(self.weight):
            return fp8_linear.glu(self, x, self.bias) if activation == "silu" else None
        return ops.gemm_glu(x, self.weight, activation) if self.bias is None else None


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

    def output_rows(self, shard_id: str) -> tuple[int, int, int]:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        offset, size = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}[shard_id]
        rank = self.tp_rank if shard_id == "q" else self.tp_rank // self.kv_replicas
        return offset, size, rank * size

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: str) -> None:
        offset, size, start = self.output_rows(shard_id)
        param.data.narrow(0, offset, size).copy_(narrow(loaded, 0, start, size))

    def forward_rope_kv(self, x, **rope) -> torch.Tensor | None:
        """The rotated query [1, q rows] where one kernel computes this projection, rotates q and k
        and writes k and v to the cache (ops.gemv_rope_kv, rope: its cache arguments), else None.
        x must be a plain row: an input the norm quantized or deferred goes the usual way."""
        if not isinstance(x, torch.Tensor):
            return None
        fp8 = self.fp8 is not None and fp8_linear.is_fp8(self.weight)
        return ops.gemv_rope_kv(x, self.weight, self.bias, self.weight_scale if fp8 else None,
                                num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, **rope)


class RowParallelLinear(LinearBase):
    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__(divide(in_features, get_tp_size()), out_features, bias, tp_dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The bias is added once, after the partial sums are reduced.
        bias = self.bias if self.tp_rank == 0 else None
        if self.fp8 is not None and fp8_linear.is_fp8(self.weight):
            # at one row the norm after may compute it, into the residual stream (fp8_residual.py)
            return fp8_residual.defer(self, x, bias) or self.tp.all_reduce(fp8_linear.apply(self, x, bias))
        return self.tp.all_reduce(ops.linear(x, self.weight, bias))

    def forward_silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """forward(silu(gate) * up) from the MLP's merged gate|up output; at decode's few rows one
        kernel does both, and the activation never goes through memory."""
        bias = self.bias if self.tp_rank == 0 else None
        if self.fp8 is not None and fp8_linear.is_fp8(self.weight):
            return (fp8_residual.defer(self, gate_up, bias, act="silu_mul")
                    or self.tp.all_reduce(fp8_linear.apply(self, gate_up, bias, act="silu_mul")))
        return self.tp.all_reduce(ops.silu_and_mul_linear(gate_up, self.weight, bias))
