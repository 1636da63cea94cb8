"""`pagoda bench throughput`: offline throughput, W1 (8B), W4 (0.5B) and W5 (MoE), on Pagoda or the HF peer.

The figure is output tokens divided by the wall time of the whole generation, after a warm-up,
as BENCHMARKS.md defines it. `--backend hf` runs the same request list through transformers'
static-batching `generate` (sdpa, left padding, batches in request order), and `--backend vllm`
through vLLM's `LLM` class (vllm_peer.py), so that the ratio comes from one run on one machine.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from pagoda.runtime.engine_args import EngineArgs, cli_knobs
from pagoda.runtime.tools.bench import ceilings, workloads
from pagoda.runtime.tools.bench.hf_peer import (
    generate_batch,
    load_hf_model,
    peak_memory_gib,
    reset_peak_memory,
)
from pagoda.runtime.tools.bench.results import command_line, write_result
from pagoda.runtime.tools.bench.roofline import W1_PUBLISHED_ROOFLINE, offline_roofline


def add_arguments(p) -> None:
    p.add_argument("--workload", default="W1", choices=sorted(workloads.WORKLOADS), help="W1 (8B), W4 (0.5B) or W5 (W1 on Qwen3-30B-A3B)")
    p.add_argument("--backend", default="pagoda", choices=["pagoda", "hf", "vllm"])
    p.add_argument("--model", default=None, help="w1, w4 (synthetic folder, random weights) or a model folder; "
                   "default: the workload's model")
    p.add_argument("--num-prompts", type=int, default=None, help="cap the request count (first N of the draw)")
    p.add_argument("--output-len", type=int, default=workloads.W1_OUTPUT_LEN)
    p.add_argument("--warmup-prompts", type=int, default=None,
                   help="requests in the warm-up run (default: as many as the timed run, so that every "
                        "batch shape, and each Triton specialization, is met before the clock starts)")
    p.add_argument("--warmup-tokens", type=int, default=16, help="output tokens per warm-up request")
    p.add_argument("--hf-batch-size", type=int, default=64, help="static batch size of the HF peer")
    p.add_argument("--gpu-busy", type=int, default=0, metavar="N",
                   help="after the timed run, profile N more requests (another draw) for W4's GPU-busy share")
    p.add_argument("--peer-result", default=None,
                   help="the other backend's result JSON from the same run: adds ratio_to_peer")
    p.add_argument("--json-schema", default=None, metavar="FILE",
                   help="W1-json: every request's output follows this JSON schema (structured outputs, compact "
                        "JSON); the model's tokenizer must spell JSON: use w1-bpe (e2e/w1_json_schema.json forces "
                        "more than 256 tokens, so every output is still exactly --output-len)")
    p.add_argument("--label", default=None,
                   help="the result's workload name (default: the workload, plus -json with --json-schema)")
    p.add_argument("--plain-result", default=None,
                   help="this workload's result without --json-schema, from the same run: adds ratio_to_plain")
    p.add_argument("--out", default=None, help="result folder (default e2e/results)")
    ceilings.add_argument(p)
    # The engine's own flags, as `pagoda serve` has them, with the benchmark's defaults: random
    # weights (BENCHMARKS.md's definition) and 2k context. Seats default to the request count (run):
    # W1 says every request may be admitted at once, and W4 and W5 are "as W1".
    EngineArgs.add_cli_args(p.add_argument_group("engine"), only=BENCH_KNOBS, defaults=BENCH_DEFAULTS)


# Engine knobs a benchmark can set: all but those that only matter to a server.
BENCH_KNOBS = cli_knobs(skip=("served_model_name", "chat_template", "disable_log_stats", "enable_log_requests"))
BENCH_DEFAULTS = {"load_format": "dummy", "max_model_len": 2048}


def engine_kwargs(args, model_path) -> dict:
    return {name: getattr(args, name) for name in BENCH_KNOBS} | {"model": str(model_path)}


def _structured(args):
    if not args.json_schema:
        return None
    from pagoda.runtime.structured_outputs_params import StructuredOutputsParams

    return StructuredOutputsParams(json=Path(args.json_schema).read_text(), disable_any_whitespace=True)


def run_pagoda(args, model_path, requests) -> dict:
    from pagoda.runtime.frontend.llm import LLM
    from pagoda.runtime.sampling_params import SamplingParams

    llm = LLM(**engine_kwargs(args, model_path))
    structured = _structured(args)  # the warm-up compiles it: the timed run pays for the masks only
    warm = warmup_requests(args, len(requests))
    if warm:
        llm.generate([{"prompt_token_ids": r.prompt_token_ids} for r in warm],
                     SamplingParams(temperature=0, max_tokens=args.warmup_tokens, ignore_eos=True,
                                    structured_outputs=structured), use_tqdm=False)
    _sync()
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True, structured_outputs=structured)
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=True)
    _sync()
    elapsed = time.perf_counter() - start
    output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    stats = llm.llm_engine.stats()  # counters include the warm-up
    extra = {"num_preemptions": stats.num_preemptions, "kv_capacity_tokens": stats.kv_capacity_tokens}
    if args.gpu_busy:
        from pagoda.runtime.tools.bench.gpu_busy import measure_gpu_busy

        # Fresh draws: the timed prompts are in the prefix cache now.
        again = workloads.offline_requests(args.gpu_busy, args.output_len, seed=args.seed + 2)
        warm_again = workloads.offline_requests(args.gpu_busy, args.warmup_tokens, seed=args.seed + 3)

        def generate(reqs, max_tokens):
            sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
            llm.generate([{"prompt_token_ids": r.prompt_token_ids} for r in reqs], sp, use_tqdm=False)

        extra.update(measure_gpu_busy(lambda: generate(again, args.output_len),
                                      lambda: generate(warm_again, args.warmup_tokens)))
        extra["gpu_busy_num_prompts"] = args.gpu_busy
    return {"elapsed_s": elapsed, "output_tokens": output_tokens, **extra}


def warmup_requests(args, num_timed: int):
    """Drawn like the workload but from another seed: reusing its prompts would hand the timed run
    prefix-cache hits."""
    count = num_timed if args.warmup_prompts is None else args.warmup_prompts
    return workloads.offline_requests(count, args.warmup_tokens, seed=args.seed + 1)


def _sync() -> None:
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()


def run_hf(args, model_path, requests) -> dict:
    model, device = load_hf_model(model_path, args.load_format, args.dtype, args.device)
    warm = [r.prompt_token_ids for r in warmup_requests(args, len(requests))[: args.hf_batch_size]]
    if warm:
        generate_batch(model, device, warm, args.warmup_tokens)
    _sync()
    reset_peak_memory()
    start = time.perf_counter()
    output_tokens = 0
    for i in range(0, len(requests), args.hf_batch_size):
        batch = [r.prompt_token_ids for r in requests[i: i + args.hf_batch_size]]
        output_tokens += generate_batch(model, device, batch, args.output_len)
    _sync()
    elapsed = time.perf_counter() - start
    return {"elapsed_s": elapsed, "output_tokens": output_tokens, "hf_batch_size": args.hf_batch_size,
            "peak_memory_gib": peak_memory_gib()}


def run_vllm(args, model_path, requests) -> dict:
    from pagoda.runtime.tools.bench import vllm_peer

    if args.gpu_busy:
        raise SystemExit("--gpu-busy profiles Pagoda's engine only; drop it with --backend vllm")
    schema = Path(args.json_schema).read_text() if args.json_schema else None
    return vllm_peer.run_throughput(args, model_path, requests, warmup_requests(args, len(requests)), schema)


RUNNERS = {"pagoda": run_pagoda, "hf": run_hf, "vllm": run_vllm}


def run(args) -> int:
    model_path = workloads.resolve_model(args.model or workloads.WORKLOAD_MODEL[args.workload])
    requests = workloads.WORKLOADS[args.workload](args.seed)
    full_count = len(requests)
    if args.num_prompts is not None:
        requests = requests[: args.num_prompts]
    command = command_line(args)  # as entered: the seat count resolved below is recorded beside it
    if args.max_num_seqs is None:
        # A seat for every request (W1: 256, W4: 1,024, which is also the engine's and vLLM's
        # default on a GPU of 70 GiB or more); the peers get the same figure.
        args.max_num_seqs = len(requests)
    measured_ceilings = ceilings.measured_before_run(args)
    measured = RUNNERS[args.backend](args, model_path, requests)
    config = workloads.load_config(model_path)
    tok_per_s = measured["output_tokens"] / measured["elapsed_s"]

    def roofline_with(**ceiling):
        # FP8 runs are held to the FP8 limit: one-byte weights (and KV) make it higher.
        return offline_roofline(
            config, [len(r.prompt_token_ids) for r in requests], args.output_len,
            fp8_weights=getattr(args, "quantization", None) == "fp8",
            kv_dtype_bytes=1 if str(getattr(args, "kv_cache_dtype", "auto")).startswith("fp8") else None,
            **ceiling)

    roof = roofline_with()
    label = args.label or (args.workload + "-json" if args.json_schema else args.workload)
    record = {
        "workload": label,
        "backend": args.backend,
        "command": command,
        "model": str(args.model or workloads.WORKLOAD_MODEL[args.workload]),
        "num_prompts": len(requests),
        "workload_num_prompts": full_count,
        "capped": len(requests) < full_count,
        "output_len": args.output_len,
        "max_num_seqs": args.max_num_seqs,
        "quantization": getattr(args, "quantization", None),
        "kv_cache_dtype": getattr(args, "kv_cache_dtype", "auto"),
        "prompt_tokens": roof.prompt_tokens,
        "output_tokens_per_s": tok_per_s,
        "roofline_output_tokens_per_s": roof.output_tokens_per_s,
        "ratio_to_roofline": tok_per_s / roof.output_tokens_per_s,
        "roofline": roof.to_dict(),
        **measured,
    }
    if args.peer_result:
        peer = json.loads(Path(args.peer_result).read_text())
        record["peer"] = {k: peer.get(k) for k in ("backend", "output_tokens_per_s", "num_prompts", "hf_batch_size")}
        record["peer_result"] = Path(args.peer_result).name
        record["ratio_to_peer"] = tok_per_s / peer["output_tokens_per_s"]
        print(f"{args.backend} / {peer['backend']}: {record['ratio_to_peer']:.2f}x")
    if args.json_schema:
        record["json_schema"] = Path(args.json_schema).name
        # Every output must still be output_len tokens long, or the batch thins out and the
        # figure is not W1's; a schema that forces more than output_len tokens keeps it so.
        record["all_full_length"] = measured["output_tokens"] == len(requests) * args.output_len
    if args.plain_result:
        plain = json.loads(Path(args.plain_result).read_text())
        record["plain_result"] = Path(args.plain_result).name
        record["plain_output_tokens_per_s"] = plain["output_tokens_per_s"]
        record["ratio_to_plain"] = tok_per_s / plain["output_tokens_per_s"]
        print(f"{label} / {plain['workload']}: {record['ratio_to_plain']:.3f}x")
    if label == "W1" and not record["capped"]:
        record["published_roofline_output_tokens_per_s"] = W1_PUBLISHED_ROOFLINE
        record["ratio_to_published_roofline"] = tok_per_s / W1_PUBLISHED_ROOFLINE
    print(f"{label} {args.backend}: {record['output_tokens']} output tokens in {record['elapsed_s']:.2f} s "
          f"= {tok_per_s:,.1f} tok/s; roofline {roof.output_tokens_per_s:,.0f} tok/s "
          f"({record['ratio_to_roofline']:.1%})")
    card = ceilings.this_gpu(args, measured_ceilings)
    if card is not None:
        own = roofline_with(tflop_per_s=card.tflop_per_s, tb_per_s=card.tb_per_s).output_tokens_per_s
        record["this_gpu_ceilings"] = asdict(card)
        record["this_gpu_roofline_output_tokens_per_s"] = own
        record["ratio_to_this_gpu_roofline"] = tok_per_s / own
        print(f"  on {card.gpu}'s own ceilings ({card.tflop_per_s:.0f} TFLOP/s, {card.tb_per_s:.2f} TB/s, "
              f"{card.source}): roofline {own:,.0f} tok/s ({tok_per_s / own:.1%})")
    write_result(record, args.out, plot=plot_throughput)
    return 0


def plot_throughput(record: dict, png_path) -> None:
    import matplotlib.pyplot as plt

    labels = [f"{record['backend']}", "roofline"]
    values = [record["output_tokens_per_s"], record["roofline_output_tokens_per_s"]]
    colors = ["tab:blue", "tab:gray"]
    if record.get("peer"):
        labels.insert(1, f"{record['peer']['backend']} (peer)")
        values.insert(1, record["peer"]["output_tokens_per_s"])
        colors.insert(1, "tab:orange")
    fig, ax = plt.subplots(figsize=(5, 4))
    bars = ax.bar(labels, values, color=colors)
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values])
    ax.set_ylabel("output tokens / s")
    ax.set_title(f"{record['workload']} offline throughput on {record['gpu']}\n"
                 f"{record['num_prompts']} requests x {record['output_len']} tokens, "
                 f"{record['ratio_to_roofline']:.1%} of roofline", fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
