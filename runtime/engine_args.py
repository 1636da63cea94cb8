"""EngineArgs: every knob the engine takes, shared by `LLM(...)` and `pagoda serve`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class EngineArgs:
    model: str
    tokenizer: str | None = None
    revision: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    num_kv_blocks: int | None = None
    # None: 1024 on a GPU of 70 GiB or more, else 256 (vLLM's defaults; see default_max_num_seqs).
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    seed: int = 0
    load_format: str = "auto"
    enforce_eager: bool = False
    served_model_name: str | None = None
    chat_template: str | None = None
    tensor_parallel_size: int = 1  # ranks (GPUs) one model is split over; see runtime/worker/distributed/
    # Who drives the engine: "llm_class" (offline batches, `LLM`) or "api_server" (`pagoda serve`).
    # It picks defaults that favour throughput or latency, as vLLM's usage context does.
    usage_context: str = "api_server"
    # Launch the next decode step before reading this one's tokens (vLLM's async scheduling).
    async_scheduling: bool = True
    max_logprobs: int = 20
    # JSON outputs without free whitespace between tokens unless a request says otherwise (vLLM's
    # structured_outputs_config.disable_any_whitespace): weak models can fill a JSON with spaces.
    structured_outputs_disable_any_whitespace: bool = False

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.usage_context not in ("llm_class", "api_server"):
            raise ValueError(f"usage_context must be llm_class or api_server; got {self.usage_context!r}")
        if self.load_format not in ("auto", "safetensors", "dummy"):
            raise ValueError(f"load_format must be one of auto, safetensors, dummy; got {self.load_format!r}")
