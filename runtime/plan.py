"""`pagoda plan MODEL --gpu-memory-gib N`: the engine's start-up memory arithmetic, before any GPU.

It reads config.json only (a folder holding it, or the file itself), so it answers for checkpoints
that are not downloaded yet; the operator runs it with --json to size replicas. The numbers come
from pagoda.runtime.memory, the same functions the engine calls at start-up. Activations are
measured on the GPU at start-up; here they are left out unless --activation-gib gives them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

GIB = 1024**3


PLAN_KNOBS = ("gpu_memory_utilization", "max_model_len", "dtype", "block_size", "quantization", "kv_cache_dtype")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from pagoda.runtime.engine_args import EngineArgs

    p.add_argument("model", help="checkpoint folder holding config.json, or the config.json file itself (no weights needed)")
    p.add_argument("--gpu-memory-gib", type=float, required=True, help="memory of one GPU, in GiB")
    EngineArgs.add_cli_args(p, only=PLAN_KNOBS)  # the same flags, defaults and help as `pagoda serve`'s
    p.add_argument("--activation-gib", type=float, default=0.0,
                   help="memory to reserve for peak activations, in GiB (default: 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object (for the operator)")


def config_dir(model: str) -> Path:
    path = Path(model)
    if path.is_file() and path.name == "config.json":
        return path.parent
    if (path / "config.json").is_file():
        return path
    raise FileNotFoundError(f"no config.json at {model}: pass a checkpoint folder or its config.json")


def make_plan(model: str, gpu_memory_gib: float, gpu_memory_utilization: float = 0.9,
              max_model_len: int | None = None, dtype: str = "auto", block_size: int = 16,
              activation_gib: float = 0.0, quantization: str | None = None, kv_cache_dtype: str = "auto") -> dict:
    from pagoda.runtime.memory import count_parameters, count_weight_bytes, plan_memory
    from pagoda.runtime.model_config import DTYPE_BYTES, ModelConfig
    from pagoda.runtime.models.registry import check_supported
    from pagoda.runtime.models.text_only import is_text_only
    from pagoda.runtime.quantization.plan_count import fp8_weight_shape
    from pagoda.runtime.quantization.scheme import resolve_scheme

    mc = ModelConfig.from_path(config_dir(model), dtype=dtype, max_model_len=max_model_len)
    check_supported(mc.architecture)
    hf_config, resolved_dtype, max_len = mc.hf_config, mc.dtype, mc.max_model_len
    dtype_bytes = DTYPE_BYTES[resolved_dtype]
    # FP8 weights on the fly or from the checkpoint (an unsupported scheme fails here, as at load),
    # counted layer by layer as the loader applies the scheme; an FP8 cache holds a byte per element
    scheme = resolve_scheme(hf_config, quantization)
    fp8_weights = scheme is not None
    weight_bytes = count_weight_bytes(hf_config, dtype_bytes, fp8_weights,
                                      fp8_weight_shape(mc, scheme) if fp8_weights else None)
    plan = plan_memory(hf_config, dtype_bytes, int(gpu_memory_gib * GIB), gpu_memory_utilization, max_len,
                       block_size=block_size, activation_bytes=int(activation_gib * GIB), weight_bytes=weight_bytes,
                       kv_dtype_bytes=1 if kv_cache_dtype != "auto" else dtype_bytes)
    result = plan.to_dict()
    result.update(
        model=str(model),
        dtype=resolved_dtype,
        weight_dtype="fp8" if fp8_weights else resolved_dtype,
        kv_cache_dtype="fp8" if kv_cache_dtype != "auto" else resolved_dtype,
        num_parameters=count_parameters(hf_config),
        # a mixture of experts runs each token through top-k experts only
        num_active_parameters=count_parameters(hf_config, active=True),
        # an image-text checkpoint is served text only: its vision tower is never loaded, nor counted
        parameters_counted="text model only (vision tower and projector not served)"
        if is_text_only(mc.architecture) else "all",
        gpu_memory_bytes=int(gpu_memory_gib * GIB),
        gpu_memory_utilization=gpu_memory_utilization,
    )
    return result


def format_plan(r: dict) -> str:
    fits = "yes" if r["fits"] else "NO: not even one max_model_len sequence fits"
    active = ""
    if r["num_active_parameters"] != r["num_parameters"]:
        active = f", {r['num_active_parameters'] / 1e9:.3f} B active per token"
    if r.get("parameters_counted", "all") != "all":
        active += f"; {r['parameters_counted']}"
    lines = [
        f"model                   {r['model']} ({r['num_parameters'] / 1e9:.3f} B parameters{active}, {r['dtype']})",
        f"GPU memory              {r['gpu_memory_bytes'] / GIB:.2f} GiB x {r['gpu_memory_utilization']} "
        f"= {r['usable_bytes'] / GIB:.2f} GiB usable",
        f"weights                 {r['weight_bytes'] / GIB:.3f} GiB ({r['weight_bytes']} bytes, "
        f"{r['weight_dtype']})",
        f"activations (reserved)  {r['activation_bytes'] / GIB:.3f} GiB",
        f"KV cache per token      {r['kv_bytes_per_token']} bytes ({r['kv_bytes_per_token'] / 1024:.1f} KiB, "
        f"{r['kv_cache_dtype']})",
        f"KV blocks               {r['num_kv_blocks']} x {r['block_size']} tokens "
        f"({r['block_bytes']} bytes each)",
        f"tokens that fit         {r['kv_capacity_tokens']}",
        f"max_model_len           {r['max_model_len']}",
        f"worst-case concurrency  {r['max_concurrent_seqs']} sequences of max_model_len" + (
            f" (sliding window of {r['sliding_window']} on every layer: blocks under it are freed)"
            if r.get("sliding_window") else ""),
        f"fits                    {fits}",
    ]
    return "\n".join(lines)


def run(args) -> int:
    try:
        result = make_plan(args.model, args.gpu_memory_gib, args.gpu_memory_utilization, args.max_model_len,
                           args.dtype, args.block_size, args.activation_gib, args.quantization,
                           args.kv_cache_dtype)
    except (OSError, ValueError, KeyError) as exc:
        print(f"pagoda plan: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else format_plan(result))
    return 0 if result["fits"] else 1
