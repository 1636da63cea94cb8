"""The memory arithmetic behind the KV pool: weights, KV bytes per token, and how many blocks fit.

Pure Python on config.json's fields, so `pagoda plan` answers without torch or a GPU, and the engine
uses the same numbers at start-up (with measured weights and activations on a GPU).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

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

    def to_dict(self) -> dict:
        return asdict(self)


def _head_dim(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def count_parameters(config: dict) -> int:
    """Parameters of a Llama/Mistral/Qwen2 checkpoint, from its config.json."""
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = _head_dim(config)
    q, kv = heads * head_dim, kv_heads * head_dim
    attn = hidden * (q + 2 * kv) + q * hidden
    if config.get("model_type") == "qwen2" or config.get("attention_bias"):
        attn += q + 2 * kv
    mlp = 3 * hidden * config["intermediate_size"]
    per_layer = attn + mlp + 2 * hidden  # two RMSNorm weights
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    return embeddings + config["num_hidden_layers"] * per_layer + hidden


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
) -> MemoryPlan:
    """Blocks = (total * utilization - weights - activations) // block bytes, unless num_kv_blocks
    overrides the pool size."""
    if weight_bytes is None:
        weight_bytes = count_parameters(config) * dtype_bytes
    per_token = kv_bytes_per_token(config, dtype_bytes)
    block_bytes = per_token * block_size
    usable = int(total_memory_bytes * gpu_memory_utilization)
    if num_kv_blocks is None:
        num_kv_blocks = max(0, (usable - weight_bytes - activation_bytes) // block_bytes)
    capacity = num_kv_blocks * block_size
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
        max_concurrent_seqs=capacity // max_model_len if max_model_len else 0,
        fits=capacity >= max_model_len,
    )


def check_fits(plan: MemoryPlan) -> None:
    if plan.fits:
        return
    need_blocks = -(-plan.max_model_len // plan.block_size)
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
