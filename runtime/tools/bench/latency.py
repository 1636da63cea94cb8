"""`pagoda bench latency`: W2, one request (128-token prompt, 256 output tokens) on the W1 model.

The figure is the time per output token, the median over decode steps. Pagoda's side steps the
engine itself (`LLMEngine.step`) and stamps the moment each new token is back on the host, so no
server or queue sits in the measurement. `--backend hf` is transformers' `generate` with a static
cache (which `generate` compiles with torch.compile on CUDA), timed by a streamer that stamps each
token; `--backend vllm` steps vLLM's own engine the same way (vllm_peer.py).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path

from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.tools.bench import ceilings, workloads
from pagoda.runtime.tools.bench.results import command_line, write_result
from pagoda.runtime.tools.bench.roofline import decode_floor_ms
from pagoda.runtime.tools.bench.throughput import BENCH_DEFAULTS, BENCH_KNOBS, engine_kwargs


def add_arguments(p) -> None:
    p.add_argument("--backend", default="pagoda", choices=["pagoda", "hf", "vllm"])
    p.add_argument("--model", default="w1", help="w1 (synthetic folder, random weights) or a model folder")
    p.add_argument("--output-len", type=int, default=workloads.W2_OUTPUT_LEN)
    p.add_argument("--warmup-iters", type=int, default=2)
    p.add_argument("--iters", type=int, default=5, help="timed runs; the figure pools their decode steps")
    p.add_argument("--hf-cache", default="static", choices=["static", "dynamic"],
                   help="static = compiled static cache (the published peer); dynamic = eager")
    p.add_argument("--peer-result", default=None,
                   help="the other backend's W2 result JSON from the same run: adds speedup_vs_peer")
    p.add_argument("--out", default=None, help="result folder (default e2e/results)")
    ceilings.add_argument(p)
    # Each iteration sends the same prompt: a prefix-cache hit would skip most of the prefill.
    EngineArgs.add_cli_args(p.add_argument_group("engine"), only=BENCH_KNOBS,
                            defaults={**BENCH_DEFAULTS, "max_num_seqs": None, "enable_prefix_caching": False})


def pagoda_token_times(engine, prompt: list[int], output_len: int, request_id: str) -> tuple[float, list[float]]:
    """Run one request alone; return (start, host time at which each output token appeared)."""
    from pagoda.runtime.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    stamps: list[float] = []
    start = time.perf_counter()
    engine.add_request(request_id, None, prompt, params)
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            if out.request_id == request_id:
                # A step may add more than one token (never here, but stamp each one it adds).
                stamps += [now] * (len(out.outputs[0].token_ids) - len(stamps))
    return start, stamps


def run_pagoda(args, model_path, prompt) -> list[tuple[float, list[float]]]:
    from pagoda.runtime.frontend.llm_engine import LLMEngine

    engine = LLMEngine.from_engine_args(EngineArgs(**engine_kwargs(args, model_path)))
    runs = []
    for i in range(args.warmup_iters + args.iters):
        runs.append(pagoda_token_times(engine, prompt, args.output_len, f"w2-{i}"))
    return runs[args.warmup_iters:]


class _TokenClock:
    """A transformers streamer that stamps each generated token (batch size 1)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        now = time.perf_counter()  # `value` is already on the host: generate() copied it (a sync)
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.stamps += [now] * value.numel()

    def end(self) -> None:
        pass


def run_hf(args, model_path, prompt) -> list[tuple[float, list[float]]]:
    import torch

    from pagoda.runtime.tools.bench.hf_peer import load_hf_model, pad_token_id

    model, device = load_hf_model(model_path, args.load_format, args.dtype, args.device)
    input_ids = torch.tensor([prompt], device=device)
    kwargs = dict(max_new_tokens=args.output_len, min_new_tokens=args.output_len, do_sample=False,
                  pad_token_id=pad_token_id(model))
    if args.hf_cache == "static":
        kwargs["cache_implementation"] = "static"
    runs = []
    for _ in range(args.warmup_iters + args.iters):
        clock = _TokenClock()
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), streamer=clock, **kwargs)
        runs.append((start, clock.stamps))
    return runs[args.warmup_iters:]


def run_vllm(args, model_path, prompt) -> list[tuple[float, list[float]]]:
    from pagoda.runtime.tools.bench import vllm_peer

    return vllm_peer.run_latency(args, model_path, prompt)


def summarize(runs: list[tuple[float, list[float]]]) -> dict:
    ttfts = [(stamps[0] - start) * 1e3 for start, stamps in runs]
    gaps = [(b - a) * 1e3 for _, stamps in runs for a, b in zip(stamps, stamps[1:])]
    gaps_sorted = sorted(gaps)
    return {
        "tpot_ms_p50": statistics.median(gaps),
        "tpot_ms_mean": statistics.fmean(gaps),
        "tpot_ms_p90": gaps_sorted[int(0.9 * (len(gaps) - 1))],
        "tpot_ms_min": gaps_sorted[0],
        "ttft_ms_p50": statistics.median(ttfts),
        "e2e_ms_p50": statistics.median((stamps[-1] - start) * 1e3 for start, stamps in runs),
        "num_decode_steps": len(gaps),
        "output_tokens_per_run": [len(stamps) for _, stamps in runs],
        # One run's per-token gaps, for the plot.
        "step_ms": [(b - a) * 1e3 for a, b in zip(runs[-1][1], runs[-1][1][1:])],
    }


def run(args) -> int:
    model_path = workloads.resolve_model(args.model)
    request = workloads.w2_request(args.seed)
    runner = {"pagoda": run_pagoda, "hf": run_hf, "vllm": run_vllm}[args.backend]
    measured_ceilings = ceilings.measured_before_run(args)
    runs = runner(args, model_path, request.prompt_token_ids)
    figures = summarize(runs)
    if any(n != args.output_len for n in figures["output_tokens_per_run"]):
        raise RuntimeError(f"expected {args.output_len} tokens per run, got {figures['output_tokens_per_run']}")
    config, fp8 = workloads.load_config(model_path), getattr(args, "quantization", None) == "fp8"
    floor = decode_floor_ms(config, fp8=fp8)
    record = {
        "workload": "W2",
        "backend": args.backend,
        "command": command_line(args),
        "model": args.model,
        "prompt_len": len(request.prompt_token_ids),
        "output_len": args.output_len,
        "iters": args.iters,
        "hf_cache": args.hf_cache if args.backend == "hf" else None,
        "quantization": getattr(args, "quantization", None),
        "kv_cache_dtype": getattr(args, "kv_cache_dtype", "auto"),
        **figures,
        "floor_ms": floor,
        "ratio_to_floor": figures["tpot_ms_p50"] / floor,
    }
    if args.peer_result:
        peer = json.loads(Path(args.peer_result).read_text())
        record["peer"] = {k: peer.get(k) for k in ("backend", "tpot_ms_p50", "hf_cache")}
        record["peer_result"] = Path(args.peer_result).name
        record["speedup_vs_peer"] = peer["tpot_ms_p50"] / figures["tpot_ms_p50"]
    print(f"W2 {args.backend}: TPOT p50 {figures['tpot_ms_p50']:.3f} ms (floor {floor:.2f} ms, "
          f"{record['ratio_to_floor']:.2f}x), TTFT p50 {figures['ttft_ms_p50']:.2f} ms")
    card = ceilings.this_gpu(args, measured_ceilings)
    if card is not None:
        own = decode_floor_ms(config, tb_per_s=card.tb_per_s, fp8=fp8)
        record["this_gpu_ceilings"] = asdict(card)
        record["this_gpu_floor_ms"] = own
        record["ratio_to_this_gpu_floor"] = figures["tpot_ms_p50"] / own
        print(f"  on {card.gpu}'s own copy ceiling ({card.tb_per_s:.2f} TB/s, {card.source}): floor {own:.2f} ms "
              f"({figures['tpot_ms_p50'] / own:.2f}x)")
    write_result(record, args.out, plot=plot_latency)
    return 0


def plot_latency(record: dict, png_path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    steps = record["step_ms"]
    ax.plot(range(1, len(steps) + 1), steps, lw=1, label=f"{record['backend']} per-token time")
    ax.axhline(record["tpot_ms_p50"], color="tab:blue", ls="--", lw=1, label=f"median {record['tpot_ms_p50']:.2f} ms")
    if record.get("peer"):
        ax.axhline(record["peer"]["tpot_ms_p50"], color="tab:orange", ls="--", lw=1,
                   label=f"{record['peer']['backend']} median {record['peer']['tpot_ms_p50']:.2f} ms")
    ax.axhline(record["floor_ms"], color="tab:gray", ls=":", label=f"floor {record['floor_ms']:.2f} ms")
    ax.set_xlabel("decode step")
    ax.set_ylabel("ms")
    ax.set_ylim(bottom=0)
    ax.set_title(f"W2 single-stream latency on {record['gpu']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
