"""Where W4's wall time goes on the GPU: per-step host and GPU time and the GPU's idle gaps, for a
few engine settings in one process, plus a cProfile table of the host's hot functions.

    python e2e/profile_w4.py --out DIR [--seats 256 1024] [--num-prompts 1024] [--cprofile 256]

Each setting builds a fresh LLM on the W4 model (random weights), warms it with another draw, and
runs W4's requests under StepRecorder (e2e/profile_gpu.py). `--ahead-first` also runs each setting
with EngineCore.step's other order (overlap_aborts=False: the step ahead launched before the
frontend's output processing), an A/B of the two. Writes profile-w4-<commit>.json.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from profile_gpu import StepRecorder, generate_fn, kernel_table, timed_generate  # noqa: E402

from pagoda.runtime.frontend.llm import LLM  # noqa: E402
from pagoda.runtime.sampling_params import SamplingParams  # noqa: E402
from pagoda.runtime.tools.bench import workloads  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--seats", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--num-prompts", type=int, default=workloads.W4_NUM_REQUESTS)
    p.add_argument("--ahead-first", action="store_true")
    p.add_argument("--gemm-glu", action="store_true", help="the engine's --gemm-glu (the fused gate|up GEMM)")
    p.add_argument("--prefill-short-context", type=int, default=None, metavar="N",
                   help="kernels/paged_attention_prefill.SHORT_CONTEXT for this run (0: heads of 64 always take "
                        "the long-prompt tile, as before 3caf23a)")
    p.add_argument("--tag", default="", help="appended to the result's file name (repeated settings in one call)")
    p.add_argument("--kernels", type=int, default=0, metavar="N",
                   help="a torch.profiler kernel table of N prompts with 64 output tokens (first setting)")
    p.add_argument("--cprofile", type=int, default=0, metavar="N", help="cProfile a run of N prompts")
    p.add_argument("--stages", type=int, default=0, metavar="N",
                   help="a run of N prompts (first setting) with wall-clock timers around the step's parts")
    args = p.parse_args()
    if args.prefill_short_context is not None:
        from pagoda.kernels import paged_attention_prefill

        paged_attention_prefill.SHORT_CONTEXT = args.prefill_short_context
    model = workloads.resolve_model("w4")
    greedy = SamplingParams(temperature=0, max_tokens=workloads.W1_OUTPUT_LEN, ignore_eos=True)
    warm = [r.prompt_token_ids for r in workloads.offline_requests(args.num_prompts, 16, seed=1)]
    result = {"commit": os.environ.get("PAGODA_COMMIT", "unknown"), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "num_prompts": args.num_prompts, "gemm_glu": args.gemm_glu,
              "prefill_short_context": args.prefill_short_context, "runs": {}}
    # The A/B flips the frontend's answer to "may this step's processing abort?", which is what
    # picks EngineCore.step's order: True keeps the old order, False launches the step ahead first.
    orders = [("launch_after_overlap", True)] + ([("ahead_first", False)] if args.ahead_first else [])
    for seats in args.seats:
        llm = LLM(model=str(model), load_format="dummy", max_model_len=2048, max_num_seqs=seats, seed=0,
                  gemm_glu=args.gemm_glu)
        rec = StepRecorder(llm.llm_engine)
        for name, may_abort in orders:
            llm.llm_engine.output_processor.has_stop_strings = lambda may_abort=may_abort: may_abort
            timed_generate(llm, rec, warm, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
            # a fresh draw each time: the prefix cache holds the last one
            seed = 10 + len(result["runs"])
            fresh = [r.prompt_token_ids for r in workloads.offline_requests(args.num_prompts, 256, seed)]
            run = timed_generate(llm, rec, fresh, greedy)
            key = f"seats{seats}-{name}"
            result["runs"][key] = run
            print(key, json.dumps(run), flush=True)
        del llm.llm_engine.output_processor.has_stop_strings
        if args.kernels and seats == args.seats[0]:
            fresh = [r.prompt_token_ids for r in workloads.offline_requests(args.kernels, 64, 98)]
            short = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
            result["kernels"] = kernel_table(generate_fn(llm, fresh, short), top=30)
            for r in result["kernels"]:
                print(f"  {r['gpu_ms']:9.2f} ms {r['share']:6.1%} x{r['count']:<6} {r['name']}", flush=True)
        if args.stages and seats == args.seats[0]:
            fresh = [r.prompt_token_ids for r in workloads.offline_requests(args.stages, 256, 97)]
            result["stages"] = stage_table(llm, fresh, greedy)
            for name, row in result["stages"].items():
                print(f"  {name:40s} {row['calls']:6d} calls {row['ms_per_call']:8.3f} ms/call {row['total_s']:7.3f} s",
                      flush=True)
        if args.cprofile and seats == args.seats[0]:
            prof = cProfile.Profile()
            fresh = [r.prompt_token_ids for r in workloads.offline_requests(args.cprofile, 256, 99)]
            t0 = time.perf_counter()
            prof.enable()
            llm.generate([{"prompt_token_ids": q} for q in fresh], greedy, use_tqdm=False)
            torch.cuda.synchronize()
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(35)
            result["cprofile"] = {"seats": seats, "prompts": args.cprofile,
                                  "wall_s": time.perf_counter() - t0, "table": buf.getvalue()}
            print(buf.getvalue(), flush=True)
        llm.shutdown()
        del llm, rec
        gc.collect()
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    short = "" if args.prefill_short_context is None else f"-short{args.prefill_short_context}"
    path = out / f"profile-w4-{result['commit']}{'-gemm-glu' if args.gemm_glu else ''}{short}{'-' + args.tag if args.tag else ''}.json"
    path.write_text(json.dumps(result, indent=1))
    print("wrote", path)
    return 0


# Beyond host_path_bench's STAGES: the parts of a step that are not scheduled ahead (a mixed step:
# the GPU waits for them) and the launch, whose host time for an eager step is kernel launches.
EXTRA_STAGES = [
    ("scheduler", "pagoda.runtime.core.scheduler", "Scheduler", "_schedule_waiting"),
    ("runner", "pagoda.runtime.worker.input_batch", "BatchBuilder", "_mixed_rows"),
    ("runner", "pagoda.runtime.worker.input_batch", "BatchBuilder", "_decode_rows"),
    ("runner", "pagoda.runtime.worker.model_runner", "ModelRunner", "launch"),
    ("core", "pagoda.runtime.core.engine_core", "EngineCore", "step"),
    ("frontend", "pagoda.runtime.frontend.llm_engine", "LLMEngine", "_process_records"),
]


def stage_table(llm, prompts, params) -> dict:
    """Wall-clock seconds in each stage over one generate (nested stages are inside their callers;
    PendingStep.wait is the host waiting for the GPU)."""
    import host_path_bench

    # StepRecorder's per-instance hooks would call the unwrapped methods: lift them meanwhile.
    engine = llm.llm_engine
    runner = engine.executor.runner if hasattr(engine, "executor") else engine.runner
    hooks = [(obj, name, obj.__dict__.pop(name)) for obj, name in ((engine, "step"), (runner, "launch"))
             if name in obj.__dict__]
    try:
        with host_path_bench.stage_timers(time.perf_counter, EXTRA_STAGES) as totals:
            t0 = time.perf_counter()
            llm.generate([{"prompt_token_ids": q} for q in prompts], params, use_tqdm=False)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            wall = time.perf_counter() - t0
    finally:
        for obj, name, hook in hooks:
            setattr(obj, name, hook)
    table = {k: {"calls": n, "total_s": round(t, 4), "ms_per_call": round(t * 1e3 / max(n, 1), 4)}
             for k, (t, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])}
    table["generate (wall)"] = {"calls": 1, "total_s": round(wall, 4), "ms_per_call": round(wall * 1e3, 3)}
    return table


if __name__ == "__main__":
    raise SystemExit(main())
