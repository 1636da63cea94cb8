"""Which kernel runs an FP8 linear layer at decode's few rows: a table of H200 measurements.

Four paths compute y = x @ (q_w * s_w)^T for an e4m3 weight:
- "gemv": the weight-only FP8 GEMV (gemv.py): x stays unquantized, silu_mul fused; 1..4 rows;
- "gemv_fp8": its second version (gemv_fp8.py: x in the weights' register layout, no shared
  memory or barrier in the loop, all rows in one loop); 1..8 rows;
- "scaled_gemv": x quantized per token (by the norm or SiLU kernel before it where fused), then the
  tensor-core small-M FP8 GEMM (scaled_gemv.py); 1..16 rows;
- "scaled_mm": x quantized, then torch._scaled_mm (cuBLASLt), the path for every other shape.
FP8_SMALL_M holds, per (rows, N, K, act), the path and launch that measured fastest on the H200
(e2e/gemv_fp8_gpu_bench.py prints the entries to paste here). A call with r rows takes the entry
of the fewest measured rows >= r for its shape (the tensor-core tile costs the same for every row
count up to 16; the GEMV's cost grows with rows, so a larger measured count is an upper bound).
Shapes and rows without an entry keep what ran before this table: the FP8 GEMV at
FP8_GEMV_MAX_ROWS rows with gemv.fp8_launch's launch, _scaled_mm above.
With ONE_ROW_TMA set (the engine's --gemv-tma), every 1-row entry of the weight-only GEMV runs the
TMA-fed GEMV of gemv_tma.py ("gemv_tma") at that launch instead, until the H200 has measured it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagoda.kernels import gemv as gemv_kernels
from pagoda.kernels.gemv import GemvConfig
from pagoda.kernels.gemv_fp8 import MAX_ROWS as GEMV_FP8_MAX_ROWS
from pagoda.kernels.gemv_fp8 import Fp8GemvConfig
from pagoda.kernels.scaled_gemv import MAX_ROWS as SCALED_GEMV_MAX_ROWS
from pagoda.kernels.scaled_gemv import ScaledGemvConfig

PATHS = ("gemv", "gemv_fp8", "gemv_tma", "scaled_gemv", "scaled_mm")
WEIGHT_ONLY = ("gemv", "gemv_fp8", "gemv_tma")  # x is not quantized
ONE_ROW_TMA = None  # a kernels.gemv_tma.TmaGemvConfig: installed by kernels.ops.configure (--gemv-tma)
# (N, K, act) -> the TMA GEMV's tile for that 1-row shape, from decode_chain_gpu_bench.py --tma-sweep
# on the H200 (none measured yet: every shape takes ONE_ROW_TMA's default tile).
TMA_TILES: dict = {}
# Rows up to which a shape without an entry takes the FP8 GEMV. Measured on the H200 (e2e/results/
# gemv-fp8-at-d29891a/): at 1 row it takes 0.42-0.70x the time of quantize + _scaled_mm on the 8B
# projections, at 4 rows 1.0-1.9x, so from 2 rows on _scaled_mm is taken.
FP8_GEMV_MAX_ROWS = 1


@dataclass(frozen=True, slots=True)
class Fp8Launch:
    path: str  # one of PATHS
    config: GemvConfig | Fp8GemvConfig | ScaledGemvConfig | None = None

    @property
    def quantizes_input(self) -> bool:
        return self.path not in WEIGHT_ONLY


# (rows, N, K, act) -> the fastest path at that many rows, measured (see the docstring): the Llama-3.1-8B
# projections on the H200 at 0cbc34a (e2e/results/w4-busy-0cbc34a/gemv-fp8-pagoda-2026-12-02.json). At one
# row the weight-only GEMV wins (2.32 ms of linears per decode step against 4.44 for _scaled_mm); from
# two rows on the tensor-core small-M GEMM does (2.5-2.6 ms at 2-8 rows).
FP8_SMALL_M: dict[tuple[int, int, int, str | None], Fp8Launch] = {
    # The 1-row launches: the best of e2e/decode_chain_gpu_bench.py's sweep at 76e57f9 (e2e/results/
    # pdl-76e57f9/), inside the 32-layer decode chain with PDL on. They took the chain from 3.10 to
    # 2.59 ms with PDL and from 2.94 to 2.79 ms without (the launches before: 0cbc34a's, timed alone).
    (1, 6144, 4096, None): Fp8Launch("gemv", GemvConfig(block_n=4, block_k=2048, split_k=1, num_warps=4, num_stages=1, fold=16)),
    (1, 4096, 4096, None): Fp8Launch("gemv", GemvConfig(block_n=8, block_k=1024, split_k=1, num_warps=4, num_stages=1, fold=1)),
    (1, 28672, 4096, None): Fp8Launch("gemv", GemvConfig(block_n=16, block_k=256, split_k=1, num_warps=4, num_stages=1, fold=1)),
    (1, 4096, 14336, "silu_mul"): Fp8Launch("gemv", GemvConfig(block_n=8, block_k=1024, split_k=1, num_warps=4, num_stages=1, fold=1)),
    # gate_up with silu(gate) * up in its epilogue (act "silu_mul_out": kernels/gemv.py; the MLP
    # takes it only where this table has an entry), and down_proj then fed the plain activation.
    # The first launches (8 rows of each half a program; the silu down entry's launch): 2.463 ms for
    # the chain with PDL against 2.519 without the epilogue (e2e/results/folds-aa7ff0a/). The sweep
    # of 069fb7d, run with the RMSNorm folded too, chose 8 x 512 / 8 warps and 2 x 2048 / fold 16;
    # without the norm fold those made the chain 2.656 ms (e2e/results/folds-b682c20/), so not these.
    (1, 28672, 4096, "silu_mul_out"): Fp8Launch("gemv", GemvConfig(block_n=8, block_k=256, split_k=1, num_warps=4, num_stages=1, fold=1)),
    (1, 4096, 14336, None): Fp8Launch("gemv", GemvConfig(block_n=8, block_k=1024, split_k=1, num_warps=4, num_stages=1, fold=1)),
    (2, 6144, 4096, None): Fp8Launch("scaled_gemv", ScaledGemvConfig(block_n=128, block_k=128, split_k=4, num_warps=4, num_stages=4)),
    (2, 4096, 4096, None): Fp8Launch("scaled_gemv", ScaledGemvConfig(block_n=64, block_k=256, split_k=4, num_warps=4, num_stages=4)),
    (2, 28672, 4096, None): Fp8Launch("scaled_gemv", ScaledGemvConfig(block_n=128, block_k=256, split_k=1, num_warps=4, num_stages=3)),
    (2, 4096, 14336, "silu_mul"): Fp8Launch("scaled_gemv", ScaledGemvConfig(block_n=64, block_k=256, split_k=4, num_warps=4, num_stages=4)),
    (4, 6144, 4096, None): Fp8Launch("scaled_gemv", ScaledGemvConfig(block_n=128, block_k=128, split_k=4, num_warps=4, num_stages=4)),
    (4, 4096, 4096, None): Fp8Launch("scaled_gemv", ScaledGemvConfig(block_n=64, block_k=256, split_k=4, num_warps=4, num_stages=4)),
    (4, 28672, 4096, None): Fp8Launch("scaled_gemv", ScaledGemvConfig(block_n=128, block_k=256, split_k=1, num_warps=4, num_stages=3)),
    (4, 4096, 14336, "silu_mul"): Fp8Launch("scaled_gemv", ScaledGemvConfig(block_n=64, block_k=256, split_k=4, num_warps=4, num_stages=4)),
    (8, 6144, 4096, None): Fp8Launch("scaled_gemv", ScaledGemvConfig(block_n=64, block_k=256, split_k=2, num_warps=4, num_stages=4)),
    (8, 4096, 4096, None): Fp8Launch("scaled_gemv", ScaledGemvConfig(block_n=64, block_k=256, split_k=4, num_warps=4, num_stages=4)),
    (8, 28672, 4096, None): Fp8Launch("scaled_gemv", ScaledGemvConfig(block_n=128, block_k=256, split_k=1, num_warps=4, num_stages=3)),
    (8, 4096, 14336, "silu_mul"): Fp8Launch("scaled_gemv", ScaledGemvConfig(block_n=64, block_k=256, split_k=4, num_warps=4, num_stages=4)),
}


def choose(rows: int, n: int, k: int, act: str | None, device: torch.device) -> Fp8Launch:
    """The launch for an FP8 layer's rows x [N, K] product (act "silu_mul": x holds gate|up;
    "silu_mul_out": W is gate|up and the output silu(gate) * up, see fused_glu)."""
    measured = _measured(n, k, act, device)
    for bucket, launch in measured:
        if rows <= bucket:
            return _tma(launch, rows, n, k, act)
    if rows <= FP8_GEMV_MAX_ROWS:
        return Fp8Launch("gemv", gemv_kernels.fp8_launch(rows, n, k, act, device))
    return Fp8Launch("scaled_mm")


def _measured(n: int, k: int, act: str | None, device: torch.device) -> list[tuple[int, Fp8Launch]]:
    """The table's entries for a shape, fewest rows first; none off Hopper (the table is the
    H200's; the interpreter, a CPU device, sees it too, for the tests)."""
    if device.type == "cuda" and not gemv_kernels.is_hopper(device):
        return []
    global _indexed
    if _indexed[0] is not FP8_SMALL_M:
        _indexed = (FP8_SMALL_M, _index(FP8_SMALL_M))
    return _indexed[1].get((n, k, act), [])


def _index(table: dict) -> dict[tuple[int, int, str | None], list[tuple[int, Fp8Launch]]]:
    """The table by shape, fewest rows first; built once per table object (replace the dict to
    change it, as a test does, rather than mutate it): the layers look it up on every forward."""
    index: dict = {}
    for (rows, n, k, act), launch in sorted(table.items(), key=lambda item: item[0][0]):
        assert launch.path in PATHS, f"unknown FP8 path {launch.path!r}"
        limit = {"gemv": gemv_kernels.MAX_ROWS, "gemv_fp8": GEMV_FP8_MAX_ROWS,
                 "scaled_gemv": SCALED_GEMV_MAX_ROWS}.get(launch.path)
        assert limit is None or rows <= limit, f"{launch.path} takes at most {limit} rows, the table says {rows}"
        index.setdefault((n, k, act), []).append((rows, launch))
    return index


_indexed: tuple[dict | None, dict] = (None, {})


def fused_glu(rows: int, n: int, k: int, device: torch.device) -> Fp8Launch | None:
    """The measured launch of the gate|up [N, K] product with silu(gate) * up in its epilogue at
    these rows, or None where the table has none (the MLP then runs gate_up and a fused down)."""
    for bucket, launch in _measured(n, k, "silu_mul_out", device):
        if rows <= bucket:
            return _tma(launch, rows, n, k, "silu_mul_out") if launch.path == "gemv" else None
    return None


# The fold's own launches where a sweep measured one faster than the plain qkv entry's, keyed by
# the FP8 weight's (N, K) (e2e/decode_chain_gpu_bench.py --rope-sweep prints them). The 8B qkv
# entry won on an H100 in two calls of 2026-12-06: the 32-layer chain 3.049 -> 2.987 ms with PDL
# (results/rope-fold-293842f/); narrow rows and long K chunks, as the plain qkv entry is not.
ROPE_KV_TILES: dict[tuple[int, int], GemvConfig] = {
    (6144, 4096): GemvConfig(block_n=2, block_k=2048, split_k=1, num_warps=4, num_stages=1, fold=16),
}


def fused_rope_kv(n: int, k: int, device: torch.device) -> GemvConfig | None:
    """The launch of the one-row qkv [N, K] GEMV with rotary and the cache write in its epilogue
    (kernels/gemv_rope.py): ROPE_KV_TILES' for the shape, else the table's 1-row weight-only gemv.py
    entry for the product where it runs one K split (the epilogue needs whole sums); None otherwise,
    and none off Hopper. With --gemv-tma as well, the fold keeps gemv.py's loop: the TMA kernel
    has no such epilogue."""
    measured = _measured(n, k, None, device)
    if measured and (n, k) in ROPE_KV_TILES:
        return ROPE_KV_TILES[(n, k)]
    for bucket, launch in measured:
        if bucket == 1 and launch.path == "gemv" and launch.config.split_k == 1:
            return launch.config
    return None


def _tma(launch: Fp8Launch, rows: int, n: int, k: int, act: str | None) -> Fp8Launch:
    """The TMA GEMV in place of a 1-row weight-only GEMV entry where ONE_ROW_TMA asks for it (its
    descriptor needs rows of whole 16 bytes; it takes no silu_mul input): at TMA_TILES' tile for the
    shape, else ONE_ROW_TMA's. The entry otherwise."""
    if ONE_ROW_TMA is None or rows != 1 or launch.path != "gemv" or k % 16 or act == "silu_mul":
        return launch
    return Fp8Launch("gemv_tma", TMA_TILES.get((n, k, act), ONE_ROW_TMA))
