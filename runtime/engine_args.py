"""EngineArgs: every engine knob, once, with its type, default, help and vLLM's flag name.

Everything else derives from the fields here: the `pagoda serve` and `pagoda bench` flags
(add_cli_args / from_cli_args), `LLM(**kwargs)` (an unknown keyword is a TypeError naming it and its
close matches), `pagoda plan`, and the operator's flag builder (to_cli_flags). Where a knob
exists in vLLM it takes vLLM's flag name and form: booleans are `--x` / `--no-x`, `--dtype half`,
`--max-model-len 32k`. Standard library only: the operator image imports this and has no torch.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import re
from dataclasses import MISSING, dataclass, field, fields

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
LOAD_FORMATS = ("auto", "safetensors", "dummy")
RUNNERS = ("auto", "generate", "pooling")  # pagoda.runtime.pooling_config reads them too
QUANTIZATIONS = ("fp8",)  # --quantization (vLLM's name); a checkpoint's own quantization_config is read anyway
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")  # fp8 is e4m3, as in vLLM
# vLLM's cudagraph modes that Pagoda has: full graphs for decode steps, piecewise ones for mixed steps
CUDAGRAPH_MODES = ("NONE", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


def human_int(value: str) -> int:
    """vLLM's readable integers (its human_readable_int): '32k' = 32000 and '1.5k' = 1500 (k, m, g, t
    decimal), '32K' = 32768 (K, M, G, T binary, whole numbers only), or a plain integer."""
    text = str(value).strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT])", text)
    if match is None:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number like 4096, 32k or 32K") from None
    number, suffix = match.groups()
    if suffix.islower():
        return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
    if "." in number:
        raise argparse.ArgumentTypeError(f"{value!r}: no decimals with the binary suffix {suffix} "
                                         f"(did you mean {number}{suffix.lower()}?)")
    return int(number) * 1024 ** ("KMGT".index(suffix) + 1)


def model_len(value: str) -> int | None:
    """--max-model-len: a human_int, or 'auto' / -1 for the model's own limit (None), as in vLLM."""
    if str(value).strip() in ("auto", "-1"):
        return None
    return human_int(value)


def moe_tile(value: str) -> str:
    """--moe-tile: 'BLOCK_M,BLOCK_N,BLOCK_K,WARPS,STAGES', five positive integers, the block sizes
    powers of two (Triton's tl.arange needs them); returned as given, parsed by moe_tile_config."""
    moe_tile_config(value)
    return value


def moe_tile_config(value: str | None) -> dict | None:
    """The fused-MoE launch a --moe-tile names (kernels/fused_moe.py's config dict), None for unset."""
    if value is None:
        return None
    parts = str(value).split(",")
    try:
        bm, bn, bk, warps, stages = (int(v) for v in parts)
    except ValueError:
        raise ValueError(f"moe_tile must be 'BLOCK_M,BLOCK_N,BLOCK_K,WARPS,STAGES' (five integers); got {value!r}") from None
    if min(bm, bn, bk, warps, stages) < 1 or any(b & (b - 1) for b in (bm, bn, bk, warps)):
        raise ValueError(f"moe_tile's block sizes and warps must be powers of two and its stages >= 1; got {value!r}")
    return dict(block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages)


def knob(default, help: str, *, type=None, choices=None, flag: str | None = None, aliases=(),
         nargs=None, metavar=None, cli: bool = True, negatable: bool = True):
    """A field of EngineArgs, described for the command line. flag: the name when it differs from
    the field's (`--x-y` for x_y); cli=False: set by code only (never a flag); negatable=False: a
    boolean that is a plain switch (`--disable-log-stats`, no `--no-disable-log-stats`)."""
    meta = dict(help=help, type=type, choices=choices, flag=flag, aliases=tuple(aliases), nargs=nargs,
                metavar=metavar, cli=cli, negatable=negatable)
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(slots=True)
class EngineArgs:
    model: str = field(metadata=dict(help="a checkpoint folder (config.json, *.safetensors, tokenizer files) "
                                          "or a Hugging Face model id", type=str, cli=False))
    tokenizer: str | None = knob(None, "tokenizer folder or Hub id (default: the model's own)", type=str)
    revision: str | None = knob(None, "Hub revision (branch, tag or commit) of the model and tokenizer",
                                type=str)
    dtype: str = knob("auto", "weight and activation dtype; half = float16 (default: auto, from config.json)",
                      type=str, choices=DTYPES)
    device: str = knob("auto", "auto (CUDA when available), cuda, cuda:N or cpu", type=str)
    max_model_len: int | None = knob(None, "longest sequence, prompt plus output, in tokens; 32k = 32000, "
                                           "32K = 32768 (default: auto, from config.json)", type=model_len)
    block_size: int = knob(16, "tokens per KV-cache block", type=int)
    gpu_memory_utilization: float = knob(0.9, "fraction of GPU memory for weights, activations and the KV "
                                              "cache", type=float)
    num_kv_blocks: int | None = knob(None, "KV-cache blocks to allocate, overriding the memory arithmetic",
                                     type=int)
    max_num_seqs: int | None = knob(None, "most sequences in one batch (default: 1024 on a GPU of 70 GiB "
                                          "or more, else 256)", type=int)
    max_num_batched_tokens: int | None = knob(None, "most tokens in one step, prefill and decode together "
                                                    "(default: 16k offline on big GPUs, else 8k)", type=human_int)
    long_prefill_token_threshold: int = knob(0, "most prompt tokens one request prefills per step; 0 = as many "
                                                "as the step's token budget leaves (a smaller chunk spreads a "
                                                "long prompt over more steps, so the decodes beside it wait "
                                                "less per token)", type=human_int)
    enable_prefix_caching: bool = knob(True, "reuse cached KV blocks of shared prompt prefixes", type=bool)
    seed: int = knob(0, "engine random seed", type=int)
    load_format: str = knob("auto", "weights from safetensors files, or 'dummy' random weights", type=str,
                            choices=LOAD_FORMATS)
    quantization: str | None = knob(None, "fp8: quantize bf16/fp16 weights to FP8 at load (per-channel weight "
                                          "scales, dynamic per-token activations); FP8 checkpoints are read "
                                          "from their quantization_config without it", type=str,
                                    choices=QUANTIZATIONS, aliases=("-q",))
    kv_cache_dtype: str = knob("auto", "KV-cache element type: auto (the model's dtype) or fp8 / fp8_e4m3 (one "
                                       "byte, per-tensor k/v scales from the checkpoint, else 1.0)", type=str,
                               choices=KV_CACHE_DTYPES)
    enforce_eager: bool = knob(False, "do not capture CUDA graphs", type=bool)
    cudagraph_mode: str = knob("FULL_AND_PIECEWISE", "FULL_AND_PIECEWISE: decode steps replay full CUDA graphs "
                                                     "and mixed prefill+decode steps piecewise ones (attention "
                                                     "eager between them); FULL_DECODE_ONLY: mixed steps run "
                                                     "eagerly; NONE: no graphs (as --enforce-eager)", type=str,
                               choices=CUDAGRAPH_MODES, flag="--compilation-config.cudagraph_mode",
                               aliases=("--cudagraph-mode",))
    max_mixed_graph_tokens: int = knob(512, "largest mixed step, in tokens, that replays piecewise CUDA graphs "
                                            "(token buckets of 8 up to 256, then 16); larger steps are "
                                            "compute-bound and run eagerly", type=human_int)
    served_model_name: list[str] | None = knob(None, "model name(s) the API accepts and reports (default: "
                                                     "the model argument)", type=str, nargs="+", metavar="NAME")
    chat_template: str | None = knob(None, "a Jinja chat template, or a file holding one (default: the "
                                           "tokenizer's own)", type=str)
    generation_config: str = knob("auto", "sampling defaults: 'auto' reads the model's generation_config.json, "
                                          "'vllm' uses none, a folder reads its generation_config.json; a "
                                          "request's own values win", type=str)
    tensor_parallel_size: int = knob(1, "split the model over N GPUs of this host, one process per GPU (N "
                                        "must divide the attention heads; on --device cpu, N gloo ranks)",
                                     type=int, aliases=("-tp",), metavar="N")
    async_scheduling: bool = knob(True, "launch the next decode step before reading this one's tokens",
                                  type=bool)
    # On by default since five H200 A/Bs (e2e/PERF_NOTES.md, "Mixed steps scheduled ahead"): W4
    # ahead in four of five pairs, W3's TPOT p50 lower at both seeds measured.
    schedule_mixed_ahead: bool = knob(True, "with async scheduling, also launch steps that admit requests "
                                            "or prefill before the step in flight is read", type=bool)
    max_logprobs: int = knob(20, "most logprobs (and prompt_logprobs) one request may ask for", type=int)
    disable_log_stats: bool = knob(False, "do not log the engine's throughput and queue every few seconds",
                                   type=bool, negatable=False)
    enable_log_requests: bool = knob(False, "log each request as it arrives, with its sampling parameters",
                                     type=bool)
    # Kernel choices, installed once when the runner starts (pagoda.kernels.ops.configure).
    enable_gemv: bool = knob(True, "Triton GEMV for linear layers at 1-4 rows where it beats cuBLAS (FP8 "
                                   "layers: instead of quantize + torch._scaled_mm)",
                             type=bool)
    fused_rope_kv: bool = knob(True, "rotary embedding fused with the KV-cache write (one kernel)", type=bool)
    # On by default since four H200 calls (e2e/PERF_NOTES.md, "Programmatic dependent launch"): W2
    # 2.90 -> 2.62 ms FP8 and 4.50 -> 4.33 bf16, greedy bits unchanged; only launches of a few rows
    # take it (kernels/pdl.MAX_ROWS), as W1 was level and W4 mixed.
    enable_pdl: bool = knob(True, "programmatic dependent launch (Hopper+): each decode kernel starts while the "
                                  "one before it ends, and a GEMV streams its first weights meanwhile",
                            type=bool)
    # The 8B FP8 decode chain on the H200 (e2e/PERF_NOTES.md, "Folds into the GEMV"): 2.52 -> 2.46 ms.
    fold_gemv: bool = knob(True, "at one FP8 decode row, gate_up's GEMV computes silu(gate) * up in its "
                                 "epilogue, so down_proj reads a plain activation (one pass fewer over it)",
                           type=bool)
    # Off: on the H200 it made W2 FP8 2.758 -> 2.947 ms and the decode chain 2.518 -> 2.578
    # (e2e/results/folds-b682c20/); a switch for benchmarks.
    fold_residual: bool = knob(False, "at one FP8 decode row, o_proj and down_proj add their output to the "
                                      "residual stream in their GEMV and the next GEMV's RMSNorm takes rstd from "
                                      "their sums of squares (no norm kernel; one rank)",
                               type=bool)
    # Off until the H200 measures it (e2e/decode_chain_gpu_bench.py's tma variant, run_pdl.sh w2tma).
    gemv_tma: bool = knob(False, "at one FP8 decode row, the weight-only GEMVs read their weight tiles by TMA into "
                                 "a shared-memory pipeline (kernels/gemv_tma.py) instead of register loads",
                          type=bool)
    # On since W2 FP8 measured it ahead twice (H100, 2026-12-06: 3.215 -> 3.184 and 3.298 -> 3.264 ms;
    # results/rope-fold-293842f/), with the same bits as the two kernels in the chain bench.
    fold_rope_kv: bool = knob(True, "at one decode row (bf16 or FP8 weights), the qkv GEMV rotates q and k and "
                                     "writes k and v to the KV cache in its epilogue (kernels/gemv_rope.py), so no "
                                     "rotary kernel runs",
                              type=bool)
    # Off: on an H100 it was at par with cuBLAS + silu_and_mul end to end (W4 1.006x, W1 0.995x;
    # e2e/results/gemm-glu-eda84be/), though 1.1-1.2x faster alone on the 0.5B shape.
    gemm_glu: bool = knob(False, "at 64 rows or more (bf16/fp16 weights), the MLP's gate|up GEMM computes "
                                 "silu(gate) * up in its epilogue (kernels/gemm_glu.py) instead of cuBLAS, then "
                                 "the activation kernel", type=bool)
    # A hand sweep's override (e2e/moe_gpu_sweep.py measures the table instead); it was the
    # PAGODA_MOE_CONFIG env var.
    moe_tile: str | None = knob(None, "one fused-MoE launch for every expert GEMM, 'BLOCK_M,BLOCK_N,BLOCK_K,"
                                      "WARPS,STAGES', in place of kernels/moe_tiles.json's tuned tiles and the "
                                      "defaults (for a hand sweep)", type=moe_tile, metavar="BM,BN,BK,WARPS,STAGES")
    tp_start_timeout_s: float = knob(1800.0, "seconds tensor-parallel workers may take to load their shards",
                                     type=float, flag="--tp-start-timeout", metavar="SECONDS")
    # vLLM's --runner: pooling serves embeddings (/v1/embeddings, LLM.embed) instead of text.
    runner: str = knob("auto", "generate (text), pooling (embeddings), or auto: pooling for a checkpoint with "
                               "sentence-transformers pooling files or a bare *Model architecture",
                       type=str, choices=RUNNERS)
    pooler_config: str | None = knob(None, "pooling runner: JSON that overrides the checkpoint's pooling, "
                                           "e.g. '{\"pooling_type\": \"MEAN\", \"normalize\": true}' "
                                           "(pooling_type LAST, MEAN or CLS)", type=str,
                                     aliases=("--override-pooler-config",), metavar="JSON")
    # Who drives the engine: "llm_class" (offline batches, `LLM`) or "api_server" (`pagoda serve`).
    # It picks defaults that favour throughput or latency, as vLLM's usage context does.
    usage_context: str = knob("api_server", "llm_class or api_server", type=str, cli=False)
    # JSON outputs without free whitespace between tokens unless a request says otherwise (vLLM's
    # structured_outputs_config.disable_any_whitespace): weak models can fill a JSON with spaces.
    structured_outputs_disable_any_whitespace: bool = knob(
        False, "JSON structured outputs (response_format, structured_outputs.json) allow no free whitespace "
        "between tokens, unless a request asks for it (default: free whitespace)", type=bool,
        flag="--structured-outputs-config.disable_any_whitespace",
        aliases=("--structured-outputs-disable-any-whitespace",), negatable=False)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        for name in ("max_num_seqs", "num_kv_blocks", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.max_logprobs < 0:
            raise ValueError(f"max_logprobs must be >= 0, got {self.max_logprobs}")
        if self.usage_context not in ("llm_class", "api_server"):
            raise ValueError(f"usage_context must be llm_class or api_server; got {self.usage_context!r}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}; got {self.load_format!r}")
        if self.runner not in RUNNERS:
            raise ValueError(f"runner must be one of {', '.join(RUNNERS)}; got {self.runner!r}")
        if self.quantization not in (None, *QUANTIZATIONS):
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)} (or unset); "
                             f"got {self.quantization!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}; got {self.kv_cache_dtype!r}")
        moe_tile_config(self.moe_tile)
        if isinstance(self.served_model_name, str):
            self.served_model_name = [self.served_model_name]

    # ---- the command line -------------------------------------------------------------------

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None,
                     defaults: dict | None = None) -> None:
        """Add a flag for each knob (or for those named in `only`), with `defaults` overriding."""
        defaults = defaults or {}
        for f in fields(cls):
            meta = f.metadata
            if not meta.get("cli", True) or (only is not None and f.name not in only):
                continue
            default = defaults.get(f.name, f.default if f.default is not MISSING else None)
            names = [flag_name(f), *meta["aliases"]]
            text = re.sub(r" \(default: [^)]*\)$", "", meta["help"]) if f.name in defaults else meta["help"]
            shown = "" if default in (None, []) or "(default:" in text else f" (default: {_format(default)})"
            if meta["type"] is bool and not meta["negatable"]:
                parser.add_argument(*names, dest=f.name, action="store_true", default=default, help=text)
                continue
            if meta["type"] is bool:
                parser.add_argument(*names, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                                    help=text + shown)
                continue
            parser.add_argument(*names, dest=f.name, type=meta["type"], default=default, choices=meta["choices"],
                                nargs=meta["nargs"], metavar=meta["metavar"], help=text + shown)

    @classmethod
    def from_cli_args(cls, namespace: argparse.Namespace, **overrides) -> EngineArgs:
        """The EngineArgs a parsed command line gives (knobs it has no flag for keep their default)."""
        values = {f.name: getattr(namespace, f.name) for f in fields(cls) if hasattr(namespace, f.name)}
        return cls(**(values | overrides))


def check_names(kwargs: dict) -> None:
    """A TypeError naming each keyword EngineArgs has no field for, with its close matches (a typo
    in LLM(max_num_seq=...) says which knob was meant)."""
    names = [f.name for f in fields(EngineArgs)]
    unknown = [k for k in kwargs if k not in names]
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k, names, n=3, cutoff=0.6)
            hints.append(f"{k!r}" + (f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""))
        raise TypeError(f"unknown engine argument{'s' if len(unknown) > 1 else ''}: {', '.join(hints)}")


_dataclass_init = EngineArgs.__init__


def _init(self, *args, **kwargs) -> None:
    check_names(kwargs)
    _dataclass_init(self, *args, **kwargs)


_init.__signature__ = inspect.signature(_dataclass_init)
EngineArgs.__init__ = _init  # the dataclass's own, after the check


def cli_knobs(skip: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The names of the knobs that have a flag, less `skip`."""
    return tuple(f.name for f in fields(EngineArgs) if f.metadata.get("cli", True) and f.name not in skip)


def flag_name(f) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def to_cli_flags(values: dict) -> list[str]:
    """`pagoda serve` flags for these knob values (the operator's flag builder); None is left out."""
    by_name = {f.name: f for f in fields(EngineArgs)}
    unknown = [k for k in values if k not in by_name or not by_name[k].metadata.get("cli", True)]
    if unknown:
        raise KeyError(f"not engine flags: {', '.join(unknown)}")
    flags: list[str] = []
    for name, value in values.items():
        if value is None:
            continue
        f = by_name[name]
        flag = flag_name(f)
        if f.metadata["type"] is bool and not f.metadata["negatable"]:
            if not value and f.default:
                raise ValueError(f"{flag} is a switch that is on by default: it cannot be turned off")
            flags += [flag] if value else []
        elif f.metadata["type"] is bool:
            flags.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, (list, tuple)):
            flags += [flag, *map(str, value)]
        else:
            flags += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return flags


def _format(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)
