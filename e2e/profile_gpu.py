"""Where the time goes in W1 and W2 on the GPU: a step-by-step split of host and GPU time, and the
kernels that fill the GPU time.

    python e2e/profile_gpu.py --out DIR [--mnbt 8192 16384] [--kernels] [--quantization fp8] [--kv-cache-dtype fp8]

For every engine step it records the host wall time of `LLMEngine.step`, the GPU time of the work
the step launched (CUDA events around `runner.launch`), and the GPU idle gap before it (from the
previous step's end event to this step's start event, on the GPU's own clock). Steps are grouped
by kind: decode (one token per running request), prefill (no decode rows) and mixed. Summed over
the run, GPU time + idle gaps is the wall time the GPU could not hide, which says whether a
workload is GPU-bound or host-bound. `--kernels` adds a torch.profiler table of the kernels of a
short W1-shaped run and of W2, by total GPU time.

The events add a few microseconds of host work per step; the benchmark figures come from
`pagoda bench`, not from here. Writes profile-<commit>.json into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

import torch

from pagoda.runtime.frontend.llm import LLM
from pagoda.runtime.sampling_params import SamplingParams
from pagoda.runtime.tools.bench import workloads


def step_kind(sched) -> str:
    num_seqs, num_tokens = len(sched.scheduled), sched.total_num_tokens
    if num_tokens == num_seqs:
        return "decode"
    decodes = sum(1 for s in sched.scheduled if s.num_tokens == 1)
    return "mixed" if decodes else "prefill"


class StepRecorder:
    """Wraps one engine's step and runner.launch with timers; `summary()` folds the records."""

    def __init__(self, engine):
        """engine: an LLMEngine or an EngineCore (whose executor's runner is the one timed)."""
        self.engine, self.records = engine, []
        runner = engine.executor.runner if hasattr(engine, "executor") else engine.runner
        self.orig_step, self.orig_launch = engine.step, runner.launch
        engine.step, runner.launch = self._step, self._launch

    def _launch(self, sched, kv, *previous):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        pending = self.orig_launch(sched, kv, *previous)
        end.record()
        self.records.append({"kind": step_kind(sched), "seqs": len(sched.scheduled),
                             "tokens": sched.total_num_tokens, "start": start, "end": end})
        return pending

    def _step(self, *a, **kw):
        t0 = time.perf_counter()
        out = self.orig_step(*a, **kw)
        if self.records and "host_ms" not in self.records[-1]:
            self.records[-1]["host_ms"] = (time.perf_counter() - t0) * 1e3
        return out

    def reset(self) -> None:
        self.records = []

    def summary(self, wall_s: float) -> dict:
        torch.cuda.synchronize()
        by_kind = defaultdict(lambda: defaultdict(float))
        prev_end = None
        for r in self.records:
            k = by_kind[r["kind"]]
            k["idle_before_ms"] += 0.0  # present even for a kind met only first
            k["steps"] += 1
            k["tokens"] += r["tokens"]
            k["gpu_ms"] += r["start"].elapsed_time(r["end"])
            k["host_ms"] += r.get("host_ms", 0.0)
            if prev_end is not None:
                k["idle_before_ms"] += max(0.0, prev_end.elapsed_time(r["start"]))
            prev_end = r["end"]
        kinds = {name: {key: round(v, 3) for key, v in k.items()} for name, k in by_kind.items()}
        for k in kinds.values():
            k["gpu_ms_per_step"] = round(k["gpu_ms"] / k["steps"], 3)
            k["idle_ms_per_step"] = round(k["idle_before_ms"] / k["steps"], 3)
        gpu = sum(k["gpu_ms"] for k in kinds.values())
        idle = sum(k["idle_before_ms"] for k in kinds.values())
        return {"wall_s": round(wall_s, 3), "gpu_s": round(gpu / 1e3, 3), "idle_between_steps_s": round(idle / 1e3, 3),
                "gpu_share_of_wall": round(gpu / 1e3 / wall_s, 3), "by_kind": kinds}


def timed_generate(llm, recorder, prompts, params) -> dict:
    torch.cuda.synchronize()
    recorder.reset()
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    result = recorder.summary(wall)
    result["output_tokens"] = sum(len(c.token_ids) for o in outs for c in o.outputs)
    result["output_tokens_per_s"] = round(result["output_tokens"] / wall, 1)
    return result


def kernel_table(fn, top: int = 25) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    from torch.autograd import DeviceType

    rows = []
    for e in prof.key_averages():
        # kernel and memset rows only: an op's row (aten::mm) repeats the time of the kernels it launched
        if e.device_type == DeviceType.CPU:
            continue
        dev_us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if dev_us > 0:
            rows.append({"name": e.key[:90], "count": e.count, "gpu_ms": round(dev_us / 1e3, 3)})
    rows.sort(key=lambda r: -r["gpu_ms"])
    total = sum(r["gpu_ms"] for r in rows)
    for r in rows:
        r["share"] = round(r["gpu_ms"] / total, 4)
    return rows[:top]


def generate_fn(llm, prompts, params):
    return lambda: llm.generate([{"prompt_token_ids": q} for q in prompts], params, use_tqdm=False)


def profile_w2_and_kernels(llm, rec, result: dict, greedy, kernels: bool) -> None:
    w2_prompt = [workloads.w2_request(0).prompt_token_ids]
    timed_generate(llm, rec, w2_prompt, greedy)  # warm the batch-1 graph
    result["w2"] = timed_generate(llm, rec, w2_prompt, greedy)
    print("W2", json.dumps(result["w2"]), flush=True)
    if not kernels:
        return
    short = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    fresh = [r.prompt_token_ids for r in workloads.offline_requests(256, 32, seed=7)]
    result["kernels_w1_short"] = kernel_table(generate_fn(llm, fresh, short))
    result["kernels_w2"] = kernel_table(generate_fn(llm, w2_prompt, greedy))
    for name in ("kernels_w1_short", "kernels_w2"):
        print(name)
        for r in result[name]:
            print(f"  {r['gpu_ms']:9.2f} ms {r['share']:6.1%} x{r['count']:<6} {r['name']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--mnbt", type=int, nargs="+", default=[16384], help="max_num_batched_tokens values to run W1 at")
    p.add_argument("--kernels", action="store_true", help="add torch.profiler kernel tables")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--quantization", default=None, help="as pagoda serve's flag (fp8)")
    p.add_argument("--kv-cache-dtype", default="auto", help="as pagoda serve's flag (fp8)")
    args = p.parse_args()
    model = workloads.resolve_model("w1")
    greedy = SamplingParams(temperature=0, max_tokens=workloads.W1_OUTPUT_LEN, ignore_eos=True)
    w1 = [r.prompt_token_ids for r in workloads.w1_requests(0)]
    warm = [r.prompt_token_ids for r in workloads.offline_requests(256, 16, seed=1)]
    result = {"commit": os.environ.get("PAGODA_COMMIT", "unknown"), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "quantization": args.quantization,
              "kv_cache_dtype": args.kv_cache_dtype, "w1": {}}
    for i, mnbt in enumerate(args.mnbt):
        llm = LLM(model=str(model), load_format="dummy", max_model_len=2048, max_num_batched_tokens=mnbt,
                  enforce_eager=args.enforce_eager, seed=0,
                  quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype)
        rec = StepRecorder(llm.llm_engine)
        generate_fn(llm, warm, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))()
        result["w1"][str(mnbt)] = timed_generate(llm, rec, w1, greedy)
        print("W1 mnbt", mnbt, json.dumps(result["w1"][str(mnbt)]), flush=True)
        if i == 0:
            profile_w2_and_kernels(llm, rec, result, greedy, args.kernels)
        llm.shutdown()
        del llm, rec
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "".join(f"-{v}" for v in (args.quantization, None if args.kv_cache_dtype == "auto" else f"kv{args.kv_cache_dtype}") if v)
    path = out / f"profile-{result['commit']}{tag}.json"
    path.write_text(json.dumps(result, indent=1))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
