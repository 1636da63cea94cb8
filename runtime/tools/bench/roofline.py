"""The physical limits of BENCHMARKS.md, computed for the workload actually run.

Offline throughput (W1, W4): the prompts are prefilled at the matmul ceiling, at 2 FLOPs per
parameter per prompt token; then every decode step reads all the weights once plus the live KV
cache of every sequence at the copy bandwidth. Step j (0-based) finds prompt_len + j tokens cached
per sequence. Attention FLOPs of the prefill and the first token's place (it comes out of the
prefill) are ignored, as in BENCHMARKS.md's figure: that keeps the limit a plain upper bound.

Published figure: 11,975 tok/s for W1. It comes out of this method with the 256 prompt lengths drawn
back to back from random.Random(0) (no token ids drawn in between). W1 as specified draws each
prompt's token ids right after its length, which gives shorter prompts in total (143,240 tokens
against 149,108) and so a higher limit for the workload that actually runs: about 12,353 tok/s.
Results carry both; ratios use the one computed for the run.

A mixture of experts (W5) runs each token through top-k of E experts per layer: prefill counts 2
FLOPs per active parameter, and a decode step of B sequences reads the weights outside the experts
plus the experts the batch touches, E * (1 - (1 - k/E)^B) per layer in expectation when routing is
uniform (random weights route nearly uniformly): 128.0 of 128 for W5's 256 sequences, so W5's
decode steps read nearly all 30.5B parameters. `active_only_output_tokens_per_s` is the bound if a
step read only one token's k experts per layer (a batch of one).

Serving (W3): serving_tpot_roofline_ms draws TPOT's limit from one rate's measured load, the same way.
Each function takes the ceilings it draws with (the offline ones default to the H200's); ceilings.py
holds other cards'.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

from pagoda.runtime.memory import count_parameters, count_weight_bytes, kv_bytes_per_token
from pagoda.runtime.models.hf_fields import is_sparse_layer, moe_shape

# H200, measured (BENCHMARKS.md): bf16 8192^3 matmul, and device-to-device copy (read + write).
H200_TFLOP_PER_S = 780.0
H200_TB_PER_S = 4.25
# FP8 prefill: Hopper's FP8 tensor cores run at twice the bf16 rate (1,979 against 989 dense
# TFLOP/s in NVIDIA's H200 figures), so the FP8 ceiling is taken as twice the measured bf16 one.
# Derived, not measured: BENCHMARKS.md measures only the bf16 matmul.
FP8_MATMUL_SPEEDUP = 2.0
W1_PUBLISHED_ROOFLINE = 11975.0
W2_PUBLISHED_FLOOR_MS = 3.78


@dataclass(slots=True)
class Roofline:
    output_tokens_per_s: float
    prefill_s: float
    decode_s: float
    num_params: int
    weight_bytes: int
    kv_bytes_per_token: int
    prompt_tokens: int
    output_tokens: int
    tflop_per_s: float
    tb_per_s: float
    num_active_params: int = 0  # per token: the MoE's top-k experts only
    decode_step_weight_bytes: int = 0  # weights one decode step of the whole batch reads
    experts_touched_per_layer: float | None = None
    active_only_output_tokens_per_s: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def offline_roofline(
    config: dict,
    prompt_lens: list[int],
    output_len: int,
    dtype_bytes: int = 2,
    tflop_per_s: float = H200_TFLOP_PER_S,
    tb_per_s: float = H200_TB_PER_S,
    fp8_weights: bool = False,
    kv_dtype_bytes: int | None = None,
) -> Roofline:
    """Upper bound on output tok/s when all requests run together (W1 admits every one at once).
    fp8_weights (--quantization fp8): the projections and experts are read at one byte each (plus
    their row scales) and prefill runs at FP8_MATMUL_SPEEDUP times the bf16 ceiling;
    kv_dtype_bytes: the KV cache's element size (1 for --kv-cache-dtype fp8), default dtype_bytes."""
    num_params = count_parameters(config)
    num_active = count_parameters(config, active=True)
    weight_bytes = count_weight_bytes(config, dtype_bytes, fp8_weights)
    kv_per_token = kv_bytes_per_token(config, kv_dtype_bytes or dtype_bytes)
    prompt_tokens = sum(prompt_lens)
    num_seqs = len(prompt_lens)
    if fp8_weights:
        tflop_per_s *= FP8_MATMUL_SPEEDUP
    prefill_s = 2 * num_active * prompt_tokens / (tflop_per_s * 1e12)
    step_bytes, touched = decode_step_weight_bytes(config, weight_bytes, num_seqs, dtype_bytes, fp8_weights)
    active_bytes = num_active * weight_bytes / num_params  # bytes per parameter, averaged
    moe = moe_shape(config)
    if moe is not None:
        sparse = sum(is_sparse_layer(config, i) for i in range(config["num_hidden_layers"]))
        per_expert = 3 * config["hidden_size"] * moe.intermediate_size
        if fp8_weights:  # the k experts at one byte, the rest (embeddings, norms, router) as stored
            active_bytes = weight_bytes - sparse * (moe.num_experts - moe.top_k) * per_expert
        else:
            active_bytes = num_active * dtype_bytes
    # sum over steps j of (prompt_tokens + num_seqs * j) cached tokens, in closed form.
    kv_token_reads = output_len * prompt_tokens + num_seqs * output_len * (output_len - 1) // 2
    kv_s = kv_token_reads * kv_per_token / (tb_per_s * 1e12)
    decode_s = output_len * step_bytes / (tb_per_s * 1e12) + kv_s
    output_tokens = num_seqs * output_len
    active_only = output_tokens / (prefill_s + output_len * active_bytes / (tb_per_s * 1e12) + kv_s)
    return Roofline(
        output_tokens_per_s=output_tokens / (prefill_s + decode_s),
        prefill_s=prefill_s,
        decode_s=decode_s,
        num_params=num_params,
        weight_bytes=weight_bytes,
        kv_bytes_per_token=kv_per_token,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        tflop_per_s=tflop_per_s,
        tb_per_s=tb_per_s,
        num_active_params=num_active,
        decode_step_weight_bytes=step_bytes,
        experts_touched_per_layer=touched,
        active_only_output_tokens_per_s=active_only if moe is not None else None,
    )


def decode_step_weight_bytes(config: dict, weight_bytes: int, num_seqs: float, dtype_bytes: int = 2,
                             fp8_weights: bool = False) -> tuple[int, float | None]:
    """(bytes of weights one decode step of num_seqs sequences reads, experts it touches per layer):
    all of them for a dense model; for a MoE, less the experts no sequence routes to (num_seqs may
    be fractional: a mean batch)."""
    moe = moe_shape(config)
    if moe is None:
        return weight_bytes, None
    sparse = sum(is_sparse_layer(config, i) for i in range(config["num_hidden_layers"]))
    per_expert = 3 * config["hidden_size"] * moe.intermediate_size
    touched = moe.num_experts * (1 - (1 - moe.top_k / moe.num_experts) ** num_seqs)
    expert_bytes = 1 if fp8_weights else dtype_bytes
    return weight_bytes - round(sparse * (moe.num_experts - touched) * per_expert) * expert_bytes, touched


def decode_floor_ms(config: dict, dtype_bytes: int = 2, tb_per_s: float = H200_TB_PER_S, fp8: bool = False) -> float:
    """W2's floor: one decode step cannot beat one read of the weights (FP8 projections: one byte
    each plus their scales)."""
    return count_weight_bytes(config, dtype_bytes, fp8) / (tb_per_s * 1e12) * 1e3


def published_w1_prompt_lens(seed: int = 0, num_requests: int = 256) -> list[int]:
    """The lengths behind the published 11,975 tok/s: drawn back to back, without token ids."""
    rng = random.Random(seed)
    return [rng.randint(128, 1024) for _ in range(num_requests)]


def serving_tpot_roofline_ms(config: dict, rate: dict, tflop_per_s: float, tb_per_s: float,
                             dtype_bytes: int = 2) -> dict:
    """W3's TPOT limit at the load one rate entry of a W3 result measured, drawn as W1's roofline:
    prefill at the matmul ceiling and decode steps at the copy bandwidth, one after the other.

    - decoding requests B = request_throughput * (e2e_ms_mean - ttft_ms_mean) (Little's law);
    - their mean context ctx = mean prompt + half the mean output;
    - prefill share f = prompt tokens/s * 2 * active params / matmul ceiling: the fraction of every
      second the GPU must spend prefilling what arrives;
    - one decode step t = max(weights it reads / BW, B * 2 * active params / FLOPS) + B * ctx * KV
      bytes per token / BW;
    - TPOT roofline = t / (1 - f), infinite when f >= 1 (prefill alone saturates the card:
      `prefill_saturates` says so).

    A bound of the non-overlapping kind, as W1's: an engine that overlapped prefill compute with the
    decode steps' reads could beat it. Means stand in for distributions, so it bounds a typical
    step, not the tail."""
    completed = rate["completed"]
    if not completed:
        raise ValueError("no completed requests at this rate: nothing to draw a roofline from")
    flops, bandwidth = tflop_per_s * 1e12, tb_per_s * 1e12
    active = count_parameters(config, active=True)
    kv_per_token = kv_bytes_per_token(config, dtype_bytes)
    decoding = rate["request_throughput"] * (rate["e2e_ms_mean"] - rate["ttft_ms_mean"]) / 1e3
    context = rate["prompt_tokens"] / completed + rate["output_tokens"] / completed / 2
    prefill_share = rate["prompt_tokens"] / rate["duration_s"] * 2 * active / flops
    step_bytes, _ = decode_step_weight_bytes(config, count_weight_bytes(config, dtype_bytes), decoding, dtype_bytes)
    step_s = max(step_bytes / bandwidth, decoding * 2 * active / flops) + decoding * context * kv_per_token / bandwidth
    saturated = prefill_share >= 1
    return {
        "tflop_per_s": tflop_per_s,
        "tb_per_s": tb_per_s,
        "num_active_params": active,
        "decode_step_weight_bytes": step_bytes,
        "kv_bytes_per_token": kv_per_token,
        "decoding_requests": decoding,
        "mean_context": context,
        "prefill_share": prefill_share,
        "step_ms": step_s * 1e3,
        "prefill_saturates": saturated,
        "tpot_roofline_ms": math.inf if saturated else step_s / (1 - prefill_share) * 1e3,
    }
