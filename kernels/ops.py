"""The kernels the runtime calls. CUDA tensors go to Triton; anything else to the torch reference.

Every function keeps the reference's signature, so model code never knows which one ran. The
Triton modules are imported on first CUDA use, so CPU-only processes never load Triton.
"""

from __future__ import annotations

import logging
import sys

import torch
import torch.nn.functional as F

from pagoda.kernels.activation_ref import gelu_tanh_and_mul_ref, silu_and_mul_ref
from pagoda.kernels.fused_moe_ref import fused_moe_ref, route_ref
from pagoda.kernels.kv_cache_ref import write_kv_cache_ref
from pagoda.kernels.norm_ref import rms_norm_ref
from pagoda.kernels.paged_attention_ref import paged_attention_ref
from pagoda.kernels.quant_fp8_ref import quantize_fp8_ref
from pagoda.kernels.rotary_ref import rotary_embedding_ref
from pagoda.kernels.sampling_ref import sample_ref

logger = logging.getLogger(__name__)


def _on_gpu(t: torch.Tensor) -> bool:
    return t.is_cuda


def write_kv_cache(key, value, k_cache, v_cache, slot_mapping, k_scale=1.0, v_scale=1.0) -> None:
    """k_scale, v_scale: an FP8 cache's per-tensor scales (it holds k / k_scale)."""
    if _on_gpu(key):
        from pagoda.kernels.kv_cache import write_kv_cache as triton_write_kv_cache

        return triton_write_kv_cache(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return write_kv_cache_ref(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)


def paged_attention(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, *,
                    sliding_window=None, softcap=None, k_scale=1.0, v_scale=1.0, **hints):
    """hints (max_query_len, max_seq_len: python ints, upper bounds are fine) let the GPU kernels
    pick a launch without a host sync. max_query_len == 1 takes the split-KV decode kernel;
    num_decode_seqs = d > 0 says the first d sequences have one query row each (see
    paged_attention_triton). sliding_window (tokens a query sees, itself included) and softcap
    (Gemma 2's cap * tanh(score / cap)) are the layer's own, as are an FP8 cache's k_scale and
    v_scale."""
    layer = dict(sliding_window=sliding_window, softcap=softcap, k_scale=k_scale, v_scale=v_scale)
    if not _on_gpu(query):
        return paged_attention_ref(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, **layer)
    return paged_attention_triton(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                                  **layer, **hints)


def paged_attention_triton(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, *,
                           sliding_window=None, softcap=None, k_scale=1.0, v_scale=1.0, max_query_len=None,
                           max_seq_len=None, num_decode_seqs=0, out=None):
    """The Triton kernels (the CPU tests run them under TRITON_INTERPRET=1).

    A mixed step puts its one-token rows first. Those go through the decode kernel, which reads
    each KV head once for its whole query-head group; the prefill kernel would read it once per
    query head, and pad each row to a 128-row tile. The rest go through the prefill kernel. Both
    write into one output, each at its own absolute query rows.
    """
    from pagoda.kernels.paged_attention_decode import paged_attention_decode
    from pagoda.kernels.paged_attention_prefill import paged_attention_prefill

    layer = dict(sliding_window=sliding_window, softcap=softcap, k_scale=k_scale, v_scale=v_scale)
    if max_query_len is None:  # no hint: find out, at the price of a sync
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max()) if len(seq_lens) else 0
    if max_query_len <= 1:
        return paged_attention_decode(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
                                      scale, **layer, max_seq_len=max_seq_len, out=out)
    d = num_decode_seqs
    if d > 0:
        out = paged_attention_decode(query, k_cache, v_cache, block_tables[:d], seq_lens[:d],
                                     query_start_loc[: d + 1], scale, **layer, max_seq_len=max_seq_len, out=out)
    return paged_attention_prefill(query, k_cache, v_cache, block_tables[d:], seq_lens[d:],
                                   query_start_loc[d:], scale, **layer, max_query_len=max_query_len,
                                   max_seq_len=max_seq_len, out=out)


def rms_norm(x, weight, eps, residual=None):
    if _on_gpu(x):
        from pagoda.kernels.norm import rms_norm as triton_rms_norm

        return triton_rms_norm(x, weight, eps, residual)
    return rms_norm_ref(x, weight, eps, residual)


def rotary_embedding(positions, query, key, cos_sin_cache, inplace: bool = False):
    """inplace=True lets the GPU kernel rotate query and key where they lie (no allocation, half the
    traffic); callers must use the returned pair either way, as the reference returns new tensors."""
    if _on_gpu(query):
        from pagoda.kernels.rotary import rotary_embedding as triton_rotary_embedding

        return triton_rotary_embedding(positions, query, key, cos_sin_cache, inplace=inplace)
    return rotary_embedding_ref(positions, query, key, cos_sin_cache)


# False runs rotary and the cache write as two kernels, so a benchmark can compare the two (the
# engine's --no-fused-rope-kv, installed by configure()).
FUSED_ROPE_KV = True


def rotary_kv_cache(positions, query, key, value, cos_sin_cache, k_cache, v_cache, slot_mapping,
                    k_scale=1.0, v_scale=1.0):
    """Rotates query and key, writes the rotated key and the value into their cache slots (an FP8
    cache: divided by k_scale, v_scale), and returns the rotated query (on the GPU, query is
    rotated where it lies and key is left as is)."""
    if not _on_gpu(query):
        query, key = rotary_embedding_ref(positions, query, key, cos_sin_cache)
        write_kv_cache_ref(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
        return query
    if not FUSED_ROPE_KV:
        query, key = rotary_embedding(positions, query, key, cos_sin_cache, inplace=True)
        write_kv_cache(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
        return query
    from pagoda.kernels.rotary_kv_cache import rotary_kv_cache as triton_rotary_kv_cache

    return triton_rotary_kv_cache(positions, query, key, value, cos_sin_cache, k_cache, v_cache, slot_mapping,
                                  k_scale, v_scale)


def silu_and_mul(x):
    if _on_gpu(x):
        from pagoda.kernels.activation import silu_and_mul as triton_silu_and_mul

        return triton_silu_and_mul(x)
    return silu_and_mul_ref(x)


def gelu_tanh_and_mul(x):
    """Gemma's GeGLU; torch's own CUDA kernel on the GPU (no model we benchmark uses it)."""
    return gelu_tanh_and_mul_ref(x)


GEMV_MAX_ROWS = 4
# At a few rows a linear layer is a weight stream, and the Triton GEMV streams faster than
# cuBLAS's small-M tiles; GEMV_ENABLED = False (the engine's --no-enable-gemv, installed by
# configure()) keeps cuBLAS, so a benchmark can compare the two.
GEMV_ENABLED = True
_GEMV_DTYPES = (torch.bfloat16, torch.float16)


def configure(enable_gemv: bool = True, fused_rope_kv: bool = True, pdl: bool = False, fold_gemv: bool = True,
              fold_residual: bool = False, gemv_tma: bool = False, fold_rope_kv: bool = True,
              moe_tile: dict | None = None, gemm_glu: bool = False, device: torch.device | None = None) -> None:
    """Install the engine's kernel choices; the model runner calls it once, when it starts (each
    tensor-parallel worker too), before any kernel runs. pdl (kernels/pdl.py) takes effect only on
    a GPU that has it (an older GPU logs a warning; the CPU needs none)."""
    global GEMV_ENABLED, FUSED_ROPE_KV, FOLD_GLU, FOLD_SUMSQ, FOLD_ROPE_KV, MOE_TILE, GEMM_GLU
    GEMM_GLU = gemm_glu
    MOE_TILE = dict(moe_tile) if moe_tile else None
    GEMV_ENABLED, FUSED_ROPE_KV, FOLD_GLU, FOLD_SUMSQ = enable_gemv, fused_rope_kv, fold_gemv, fold_residual
    FOLD_ROPE_KV = fold_rope_kv
    # the TMA GEMV needs a CUDA GPU; its modules import Triton, which a CPU process never loads for this
    dispatch = sys.modules.get("pagoda.kernels.fp8_dispatch")
    if gemv_tma and device is not None and device.type == "cuda":
        from pagoda.kernels import fp8_dispatch as dispatch
        from pagoda.kernels.gemv_tma import TmaGemvConfig

        dispatch.ONE_ROW_TMA = TmaGemvConfig()
    elif dispatch is not None:
        dispatch.ONE_ROW_TMA = None
    # pdl.py imports Triton: a CPU process never loads it for this
    launch = sys.modules.get("pagoda.kernels.pdl")
    wanted = pdl and device is not None and device.type == "cuda"
    if wanted:
        from pagoda.kernels import pdl as launch

        if not launch.supported(device):
            logger.warning("--enable-pdl needs a GPU of compute capability 9.0 or later (%s): left off",
                           torch.cuda.get_device_name(device))
    if launch is not None:
        launch.ENABLED = wanted and launch.supported(device)


def _use_gemv(x, weight, bias=None) -> bool:
    """Whether the Triton GEMV takes y = x @ weight^T: CUDA, 1..GEMV_MAX_ROWS rows (the rows cost
    registers in every program; more go to cuBLAS), 2-byte floats throughout, rows contiguous."""
    if not GEMV_ENABLED or x.dim() == 0 or x.shape[-1] == 0:
        return False
    rows = x.numel() // x.shape[-1]
    return (
        1 <= rows <= GEMV_MAX_ROWS
        and _on_gpu(x)
        and x.dtype in _GEMV_DTYPES
        and weight.dtype == x.dtype
        and (bias is None or bias.dtype == x.dtype)
        and weight.dim() == 2
        and weight.stride(1) == 1
        and x.stride(-1) == 1
    )


def _gemv_launch(x, weight, bias, act):
    """The GEMV's launch when it may take this call and measured faster than cuBLAS on this shape
    (pagoda.kernels.gemv.FASTER_THAN_CUBLAS), else None: cuBLAS."""
    if not _use_gemv(x, weight, bias):
        return None
    from pagoda.kernels.gemv import measured_win

    return measured_win(x.numel() // x.shape[-1], weight.shape[0], weight.shape[1], act, x.device)


def linear(x, weight, bias=None):
    """y = x @ weight^T + bias, as F.linear."""
    config = _gemv_launch(x, weight, bias, None)
    if config is not None:
        from pagoda.kernels.gemv import gemv

        return gemv(x, weight, bias, config=config)
    return F.linear(x, weight, bias)


# The engine's --gemm-glu (configure()): from GEMM_GLU_MIN_ROWS rows the gate|up GEMM is a Triton
# kernel with silu(gate) * up in its epilogue (kernels/gemm_glu.py), so the two halves never go
# through memory; fewer rows keep cuBLAS, and at 1-4 the GEMV folds the activation into down_proj.
GEMM_GLU = False
GEMM_GLU_MIN_ROWS = 64


def gemm_glu(x, weight, activation: str = "silu"):
    """act(gate) * up of the merged gate|up projection x @ weight^T from one kernel where --gemm-glu
    takes it (CUDA, 16-bit floats throughout, GEMM_GLU_MIN_ROWS rows or more), else None."""
    if not GEMM_GLU or not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] == 0:
        return None
    if not (_on_gpu(x) and x.dtype in _GEMV_DTYPES and weight.dtype == x.dtype and weight.dim() == 2
            and weight.stride(1) == 1 and x.numel() // x.shape[-1] >= GEMM_GLU_MIN_ROWS):
        return None
    from pagoda.kernels.gemm_glu import gemm_glu as triton_gemm_glu

    return triton_gemm_glu(x, weight, activation)


def silu_and_mul_linear(x, weight, bias=None):
    """linear(silu_and_mul(x), weight, bias) for x = [..., 2 * d] holding gate then up. At one row
    one GEMV kernel computes the activation on the fly, so it is never written out."""
    config = _gemv_launch(x, weight, bias, "silu_mul")
    if config is not None:
        from pagoda.kernels.gemv import gemv

        return gemv(x, weight, bias, act="silu_mul", config=config)
    return F.linear(silu_and_mul(x), weight, bias)


# False keeps RMSNorm and the FP8 activation quantization after it as two kernels, so a benchmark
# can compare the two (runtime/quantization/fp8_linear.norm_for).
FUSED_NORM_QUANT = True
# At one row the weight-only FP8 GEMV computes the MLP's silu(gate) * up in gate_up's epilogue
# (FOLD_GLU: the engine's --fold-gemv, installed by configure(); fp8_linear.glu), which took the 8B
# FP8 decode chain from 2.52 to 2.46 ms on the H200. It may also take the RMSNorm before it into its
# input (FOLD_NORM, fp8_linear.norm_for); that made the chain slower (2.52 -> 2.87 ms: each program's
# pass over the whole row for rstd outlasts the norm kernel PDL overlaps), so it stays off, a switch
# for benchmarks (e2e/PERF_NOTES.md, "Folds into the GEMV").
FOLD_NORM = False
FOLD_GLU = True
# o_proj and down_proj add their one-row output to the residual stream in their GEMV's epilogue and
# sum its squares there, and the next GEMV's folded norm takes rstd from those sums, so no norm
# kernel runs (runtime/quantization/fp8_residual.py). The engine's --fold-residual, off: it made the
# 8B FP8 chain 2.518 -> 2.578 ms and W2 2.758 -> 2.947 ms on the H200 (e2e/results/folds-b682c20/).
FOLD_SUMSQ = False


# At one decode row the qkv GEMV may rotate q and k and write k and v to their cache slot in its
# epilogue (kernels/gemv_rope.py), so rotary_kv_cache does not run: a launch and its PDL hand-over
# fewer per layer. The engine's --fold-rope-kv (on), installed by configure().
FOLD_ROPE_KV = True


def gemv_rope_kv(x, weight, bias, weight_scale, *, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
                 num_heads, num_kv_heads, k_scale=1.0, v_scale=1.0):
    """The rotated query [1, num_heads * head_dim] of qkv = x @ weight^T (+ bias; an FP8 weight times
    weight_scale), its key and value written to slot_mapping[0] of the caches, from one kernel; or
    None where that fold does not take this call (FOLD_ROPE_KV off, not one row on the GPU, no
    measured one-split GEMV launch for the shape), and the caller runs the projection and
    rotary_kv_cache. Like fp8_path, it reads shapes and dtypes only: a captured graph keeps it."""
    if not FOLD_ROPE_KV or x.dim() == 0 or x.shape[-1] == 0 or x.numel() != x.shape[-1] or not _on_gpu(x):
        return None
    if weight_scale is not None:
        if fp8_path(x, weight, bias).path not in ("gemv", "gemv_tma"):
            return None
        from pagoda.kernels.fp8_dispatch import fused_rope_kv

        config = fused_rope_kv(weight.shape[0], weight.shape[1], x.device)
    else:
        config = _gemv_launch(x, weight, bias, None)
    head_dim = weight.shape[0] // (num_heads + 2 * num_kv_heads)
    if (config is None or config.split_k != 1 or (head_dim // 2) % config.block_n
            or cos_sin_cache.shape[-1] != head_dim or x.stride(-1) != 1):
        return None
    from pagoda.kernels.gemv_rope import RopeKv
    from pagoda.kernels.gemv_rope import gemv_rope_kv as triton_gemv_rope_kv

    rope = RopeKv(positions, cos_sin_cache, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads, k_scale, v_scale)
    return triton_gemv_rope_kv(x, weight, bias, rope, weight_scale=weight_scale, config=config)


def fp8_path(x, weight, bias=None, act=None):
    """How an FP8 layer computes act(x) @ (weight * scale)^T + bias: a kernels.fp8_dispatch.Fp8Launch
    ("gemv": the weight-only FP8 GEMV, x unquantized; "scaled_gemv": x quantized, then the
    tensor-core small-M GEMM; "scaled_mm": x quantized, then torch._scaled_mm), from the table of
    measured launches at decode's few rows. It reads only x's shape, dtype and strides, never its
    values, so a captured CUDA graph keeps the choice its bucket made."""
    from pagoda.kernels.fp8_dispatch import WEIGHT_ONLY, Fp8Launch, choose

    if not GEMV_ENABLED or x.dim() == 0 or x.numel() == 0 or not _on_gpu(x) or x.stride(-1) != 1:
        return Fp8Launch("scaled_mm")
    launch = choose(x.numel() // x.shape[-1], weight.shape[0], weight.shape[1], act, x.device)
    if launch.path in WEIGHT_ONLY and not (x.dtype in (*_GEMV_DTYPES, torch.float32)
                                      and (bias is None or bias.dtype == x.dtype)):
        return Fp8Launch("scaled_mm")
    return launch


def fp8_gemv(x, weight, weight_scale, bias=None, act=None, config=None, path="gemv", *, norm=None,
             epilogue=None, residual_sumsq=None, out=None):
    """y = act(x) @ (weight * weight_scale)^T + bias for an e4m3 weight [N, K] and its float32 scales
    (per row or per tensor), x left unquantized; act None or "silu_mul" (x then holds gate|up).
    path "gemv" runs kernels/gemv.py, "gemv_fp8" its second version (kernels/gemv_fp8.py). norm (a
    kernels.gemv.GemvNorm), epilogue ("silu_mul") and residual_sumsq (a kernels.gemv.ResidualSumsq)
    are gemv.py's folds: that path only."""
    if path == "gemv_tma":
        assert act is None and norm is None and residual_sumsq is None and out is None, "gemv_tma: epilogue only"
        from pagoda.kernels.gemv_tma import gemv_tma

        return gemv_tma(x, weight, weight_scale, bias, config=config, epilogue=epilogue).view(*x.shape[:-1], -1)
    if path == "gemv_fp8":
        assert norm is None and epilogue is None and residual_sumsq is None, "gemv_fp8 folds nothing"
        from pagoda.kernels.gemv_fp8 import fp8_gemv as triton_fp8_gemv

        return triton_fp8_gemv(x, weight, weight_scale, bias, act=act, config=config)
    from pagoda.kernels.gemv import fp8_launch, gemv

    n, k = weight.shape
    config = config or fp8_launch(x.numel() // x.shape[-1], n, k, act, x.device)
    return gemv(x, weight, bias, weight_scale=weight_scale, act=act, config=config, norm=norm, epilogue=epilogue,
                residual_sumsq=residual_sumsq, out=out)


def scaled_gemv(q, scale_x, weight, weight_scale, bias=None, *, out_dtype, config=None):
    """(q * scale_x) @ (weight * weight_scale)^T + bias for e4m3 q [M <= 16, K] and weight [N, K]:
    torch._scaled_mm's arithmetic on the tensor-core small-M kernel (the reference elsewhere)."""
    if _on_gpu(q):
        from pagoda.kernels.scaled_gemv import scaled_gemv as triton_scaled_gemv

        return triton_scaled_gemv(q, scale_x, weight, weight_scale, bias, out_dtype=out_dtype, config=config)
    from pagoda.kernels.scaled_gemv_ref import scaled_gemv_ref

    return scaled_gemv_ref(q, scale_x, weight, weight_scale, bias, out_dtype=out_dtype)


def rms_norm_quant_fp8(x, weight, eps, residual=None, scale=None):
    """rms_norm, then quantize_fp8 of its output, in one kernel on the GPU: (q, scale [M, 1]), and
    with residual ((q, scale), x + residual)."""
    if _on_gpu(x):
        from pagoda.kernels.norm_quant import rms_norm_quant_fp8 as triton_rms_norm_quant_fp8

        return triton_rms_norm_quant_fp8(x, weight, eps, residual, scale)
    from pagoda.kernels.norm_quant_ref import rms_norm_quant_fp8_ref

    return rms_norm_quant_fp8_ref(x, weight, eps, residual, scale)


def quantize_fp8(x, scale=None, *, silu_mul: bool = False):
    """(q e4m3 [M, K], scale float32 [M, 1]) with x ~= q * scale: per token, or with a static
    per-tensor scale. silu_mul: x is [M, 2 * K], gate then up, and silu(gate) * up is quantized
    (on the GPU in the one kernel)."""
    if _on_gpu(x):
        from pagoda.kernels.quant_fp8 import quantize_fp8 as triton_quantize_fp8

        return triton_quantize_fp8(x.contiguous(), scale, silu_mul=silu_mul)
    return quantize_fp8_ref(silu_and_mul_ref(x) if silu_mul else x, scale)


def moe_route(router_logits, top_k: int, renormalize: bool):
    """(topk_weights, topk_ids) of each token: softmax in fp32, the top k, renormalised if asked."""
    if _on_gpu(router_logits):
        from pagoda.kernels.moe_route import moe_route as triton_moe_route

        return triton_moe_route(router_logits.contiguous(), top_k, renormalize)
    return route_ref(router_logits, top_k, renormalize)


# False runs FP8 experts weight-only (W8A16) even where the checkpoint's scheme quantizes activations,
# so a benchmark can compare the two (runtime/quantization/fp8_moe.apply).
MOE_FP8_W8A8 = True
# --moe-tile: one fused-MoE launch (kernels/fused_moe.py's config dict) for every expert GEMM, in
# place of the tuned table and the defaults; None: the table, then the defaults.
MOE_TILE: dict | None = None


def fused_moe(x, w13, w2, topk_weights, topk_ids, activation: str = "silu", **fp8):
    """The experts' gated MLPs, weighted by the routing weights and summed per token. fp8: e4m3
    experts' w13_scale and w2_scale (float32, one per expert and output row), and activations
    ("none": weight-only; else how W8A8 quantizes each GEMM's input) with a13_scale and a2_scale
    for static ones (kernels/fused_moe.py)."""
    if _on_gpu(x):
        from pagoda.kernels.fused_moe import fused_moe as triton_fused_moe

        return triton_fused_moe(x, w13, w2, topk_weights, topk_ids, activation, config=MOE_TILE, **fp8)
    if fp8.get("w13_scale") is not None:
        from pagoda.kernels.fused_moe_ref import fused_moe_fp8_ref

        return fused_moe_fp8_ref(x, w13, w2, fp8["w13_scale"], fp8["w2_scale"], topk_weights, topk_ids, activation,
                                 fp8.get("activations", "none"), fp8.get("a13_scale"), fp8.get("a2_scale"))
    return fused_moe_ref(x, w13, w2, topk_weights, topk_ids, activation)


def sample(logits, temperature, top_k, top_p, min_p, seeds, steps, **hints):
    """Sampled ids, int64 [num_seqs], left on the logits' device (reading them is the step's one
    sync). hints: all_greedy, need_cutoffs (see pagoda.kernels.sampling.sample)."""
    if _on_gpu(logits):
        from pagoda.kernels.sampling import sample as triton_sample

        return triton_sample(logits, temperature, top_k, top_p, min_p, seeds, steps, **hints)
    return sample_ref(logits, temperature, top_k, top_p, min_p, seeds, steps)
