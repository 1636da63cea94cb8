"""The memory arithmetic behind the KV pool: weights, KV bytes per token, and how many blocks fit.

Pure Python on config.json's fields, so `pagoda plan` answers without torch or a GPU, and the engine
uses the same numbers at start-up (with measured weights and activations on a GPU).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pagoda.runtime.models.hf_fields import (
    GEMMA_TYPES,
    freeable_window,
    has_qk_norm,
    has_qkv_bias,
    is_sparse_layer,
    moe_shape,
)

GIB = 1024**3


@dataclass(slots=True)
class MemoryPlan:
    weight_bytes: int
    kv_bytes_per_token: int
    block_size: int
    block_bytes: int
    activation_bytes: int
    usable_bytes: int  # total * utilization
    num_kv_blocks: int
    kv_capacity_tokens: int
    max_model_len: int
    max_concurrent_seqs: int
    fits: bool
    # Blocks one sequence holds at most: all of max_model_len, or with a sliding window on every
    # layer the window plus one block at each end (and a prefill chunk, for `fits`).
    sliding_window: int | None = None
    max_blocks_per_seq: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def _head_dim(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def count_parameters(config: dict, active: bool = False) -> int:
    """Parameters of a checkpoint of any supported family, from its config.json. With
    active=True, a mixture of experts counts only the top-k experts a token runs through."""
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = _head_dim(config)
    q, kv = heads * head_dim, kv_heads * head_dim
    attn = hidden * (q + 2 * kv) + q * hidden
    if has_qkv_bias(config):
        attn += q + 2 * kv
    if has_qk_norm(config):
        attn += 2 * head_dim
    # two RMSNorm weights per block; Gemma 2 and 3 add a pair around the feed-forward
    norms = (4 if config.get("model_type") in GEMMA_TYPES else 2) * hidden
    moe = moe_shape(config)
    total = 0
    for i in range(config["num_hidden_layers"]):
        if moe is not None and is_sparse_layer(config, i):
            experts = moe.top_k if active else moe.num_experts
            mlp = experts * 3 * hidden * moe.intermediate_size + hidden * moe.num_experts  # + router
        else:
            mlp = 3 * hidden * config["intermediate_size"]
        total += attn + mlp + norms
    tied = config.get("tie_word_embeddings", config.get("model_type") in GEMMA_TYPES)
    embeddings = vocab * hidden * (1 if tied else 2)
    return embeddings + total + hidden


def fp8_linear_shape(config: dict) -> tuple[int, int]:
    """(parameters, output rows) of the weights FP8 covers: attention and dense MLP projections and
    every MoE expert's gate, up and down matrices (embeddings, LM head, norms and MoE routers stay
    in the compute dtype, as runtime/quantization/apply.py leaves them)."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    q, kv = heads * _head_dim(config), kv_heads * _head_dim(config)
    moe = moe_shape(config)
    params = rows = 0
    for i in range(config["num_hidden_layers"]):
        params += hidden * (q + 2 * kv) + q * hidden
        rows += q + 2 * kv + hidden
        if moe is None or not is_sparse_layer(config, i):
            params += 3 * hidden * config["intermediate_size"]
            rows += 2 * config["intermediate_size"] + hidden
        else:  # every expert: gate and up [inter, hidden], down [hidden, inter], a scale per output row
            params += moe.num_experts * 3 * hidden * moe.intermediate_size
            rows += moe.num_experts * (2 * moe.intermediate_size + hidden)
    return params, rows


def count_weight_bytes(config: dict, dtype_bytes: int, fp8: bool = False,
                       fp8_shape: tuple[int, int] | None = None) -> int:
    """Bytes of the weights; with fp8, the projections and MoE experts at one byte each plus a
    float32 scale per output row. fp8_shape: (parameters, rows) of the FP8 weights when known from
    the checkpoint's scheme (quantization/plan_count.py); else every projection counts."""
    total = count_parameters(config) * dtype_bytes
    if fp8:
        params, rows = fp8_shape or fp8_linear_shape(config)
        total += params * (1 - dtype_bytes) + rows * 4
    return total


def kv_bytes_per_token(config: dict, dtype_bytes: int) -> int:
    kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * kv_heads * _head_dim(config) * dtype_bytes


def plan_memory(
    config: dict,
    dtype_bytes: int,
    total_memory_bytes: int,
    gpu_memory_utilization: float,
    max_model_len: int,
    block_size: int = 16,
    activation_bytes: int = 0,
    weight_bytes: int | None = None,
    num_kv_blocks: int | None = None,
    max_num_batched_tokens: int | None = None,
    kv_dtype_bytes: int | None = None,
    fp8_weights: bool = False,
) -> MemoryPlan:
    """Blocks = (total * utilization - weights - activations) // block bytes, unless num_kv_blocks
    overrides the pool size. With a sliding window on every layer, a decoding sequence holds at
    most cdiv(window, block_size) + 1 blocks, which sets the worst-case concurrency; `fits` also
    counts one prefill chunk of max_num_batched_tokens (all of max_model_len when unknown).
    kv_dtype_bytes: bytes per KV element (1 for an FP8 cache; default dtype_bytes); fp8_weights:
    count FP8 projections when weight_bytes is not measured."""
    if weight_bytes is None:
        weight_bytes = count_weight_bytes(config, dtype_bytes, fp8_weights)
    per_token = kv_bytes_per_token(config, kv_dtype_bytes or dtype_bytes)
    block_bytes = per_token * block_size
    usable = int(total_memory_bytes * gpu_memory_utilization)
    if num_kv_blocks is None:
        num_kv_blocks = max(0, (usable - weight_bytes - activation_bytes) // block_bytes)
    capacity = num_kv_blocks * block_size
    window = freeable_window(config)
    concurrent = capacity // max_model_len if max_model_len else 0
    fits, needed = capacity >= max_model_len, -(-max_model_len // block_size)
    if window is not None and max_model_len:
        per_seq = min(needed, -(-window // block_size) + 1)
        chunk = max_num_batched_tokens or max_model_len
        needed = min(needed, -(-(window - 1 + chunk) // block_size) + 1)
        concurrent, fits = num_kv_blocks // per_seq, num_kv_blocks >= needed
    return MemoryPlan(
        weight_bytes=weight_bytes,
        kv_bytes_per_token=per_token,
        block_size=block_size,
        block_bytes=block_bytes,
        activation_bytes=activation_bytes,
        usable_bytes=usable,
        num_kv_blocks=num_kv_blocks,
        kv_capacity_tokens=capacity,
        max_model_len=max_model_len,
        max_concurrent_seqs=concurrent,
        fits=fits,
        sliding_window=window,
        max_blocks_per_seq=needed,
    )


def check_fits(plan: MemoryPlan) -> None:
    if plan.fits:
        return
    need_blocks = plan.max_blocks_per_seq
    raise ValueError(
        f"the KV cache cannot hold even one sequence of max_model_len={plan.max_model_len} tokens: "
        f"{plan.num_kv_blocks} blocks of {plan.block_size} tokens = {plan.kv_capacity_tokens} tokens "
        f"({plan.num_kv_blocks * plan.block_bytes / GIB:.2f} GiB), but one sequence needs {need_blocks} "
        f"blocks ({need_blocks * plan.block_bytes / GIB:.2f} GiB at {plan.kv_bytes_per_token} bytes per "
        f"token). Usable memory is {plan.usable_bytes / GIB:.2f} GiB, weights take "
        f"{plan.weight_bytes / GIB:.2f} GiB and activations {plan.activation_bytes / GIB:.2f} GiB. "
        "Lower max_model_len, raise gpu_memory_utilization (or num_kv_blocks), or use a GPU with "
        "more memory."
    )
