"""What the host does while the GPU idles in W4's admission phase (issue 16's busy share).

    python e2e/w4_gap_trace.py --out DIR [--seats 1024] [--num-prompts 1024] [--output-len 4]
                               [--mixed-ahead on|off] [--traces [plain] [python]] [--syncs]

W4's prompts at few output tokens, so nearly every step is a mixed (admission) step, under
torch.profiler twice: once plain, once with Python stacks. From each trace it takes the GPU's busy
intervals (kernels, copies, memsets), the gaps between them longer than --min-gap-ms, and, summed
over all gaps, how long each host event overlapped them: CUDA runtime calls and aten ops in the
plain run, Python functions in the stacked one (their time is inflated by the stack recording, so
read them as a ranking). `--mixed-ahead on|off` schedules mixed steps ahead or not
(`--schedule-mixed-ahead`; default: the engine's). `--syncs` adds a run without the profiler under
torch.cuda.set_sync_debug_mode("warn"): every synchronizing CUDA call the host makes, by the runtime
line that made it, per step. Steps ahead are meant to wait only in PendingStep.wait; any other site
(an .item(), a pageable copy) holds the host until the GPU drains, and the GPU then waits for the
enqueue that follows. Writes w4-gaps-<commit>.json (-mixed-ahead.json with it on); the traces stay
on the machine.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import tempfile
import traceback
import warnings
from collections import Counter, defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.frontend.llm import LLM
from pagoda.runtime.sampling_params import SamplingParams
from pagoda.runtime.tools.bench import workloads

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def busy_intervals(events: list[dict]) -> list[tuple[float, float]]:
    spans = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events if e.get("cat") in GPU_CATS)
    merged: list[list[float]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def gap_report(trace: Path, host_cats: set[str], min_gap_us: float, top: int) -> dict:
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    busy = busy_intervals(events)
    if not busy:
        return {"error": "no GPU events in the trace"}
    gaps = [(busy[i][1], busy[i + 1][0]) for i in range(len(busy) - 1) if busy[i + 1][0] - busy[i][1] >= min_gap_us]
    starts = [g[0] for g in gaps]
    overlap: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("cat") not in host_cats or not gaps:
            continue
        a, b = e["ts"], e["ts"] + e.get("dur", 0)
        i = max(0, bisect.bisect_right(starts, a) - 1)
        hit = False
        while i < len(gaps) and gaps[i][0] < b:
            lo, hi = max(a, gaps[i][0]), min(b, gaps[i][1])
            if hi > lo:
                overlap[e["name"]] += hi - lo
                hit = True
            i += 1
        if hit:
            calls[e["name"]] += 1
    wall = busy[-1][1] - busy[0][0]
    busy_us = sum(b - a for a, b in busy)
    ranked = sorted(overlap.items(), key=lambda kv: -kv[1])[:top]
    # Where in the run the idle time sits: before the first GPU event (requests added, the first
    # schedule), after the last, and the gaps by tenth of the window (admission phase first, the
    # waves' ends later), which the whole-run busy share of `bench --gpu-busy` sums up.
    first = min(e["ts"] for e in events)
    last = max(e["ts"] + e.get("dur", 0) for e in events)
    tenths = [0.0] * 10
    for a, b in gaps:
        tenths[min(9, int(10 * (a - busy[0][0]) / wall))] += b - a
    return {
        "window_ms": round(wall / 1e3, 2), "gpu_busy_share": round(busy_us / wall, 4),
        "lead_ms": round((busy[0][0] - first) / 1e3, 2), "tail_ms": round((last - busy[-1][1]) / 1e3, 2),
        "gap_ms_by_tenth": [round(t / 1e3, 2) for t in tenths],
        "gaps": len(gaps), "gap_ms_total": round(sum(b - a for a, b in gaps) / 1e3, 2),
        "gap_ms_largest": sorted((round((b - a) / 1e3, 2) for a, b in gaps), reverse=True)[:20],
        "host_in_gaps": [{"name": n[:200], "ms": round(us / 1e3, 2), "events": calls[n]} for n, us in ranked],
    }


RUNTIME_DIRS = ("/runtime/", "/kernels/")  # frames of Pagoda's own code, wherever the tree was copied to


def sync_sites(run, llm) -> dict:
    """run() with torch's sync debug mode warning on every synchronizing CUDA call: the calls by the
    innermost runtime frame that made them (count, and one stack), and the engine steps it took."""
    sites: Counter = Counter()
    stacks: dict[str, list[str]] = {}

    def record(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1] if any(d in f.filename for d in RUNTIME_DIRS)]
        key = f"{frames[-1].filename.split('/')[-1]}:{frames[-1].lineno} {frames[-1].name}" if frames else "outside the runtime"
        sites[key] += 1
        stacks.setdefault(key, [f"{f.filename.split('/')[-1]}:{f.lineno} {f.name}" for f in frames[-6:]])

    engine, steps = llm.llm_engine, [0]
    step = engine.step

    def counted(*args, **kwargs):
        steps[0] += 1
        return step(*args, **kwargs)

    engine.step = counted  # an instance attribute over the method, deleted after
    shown = warnings.showwarning
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = shown
            del engine.step
    return {"steps": steps[0], "sites": [{"site": k, "calls": n, "stack": stacks[k]} for k, n in sites.most_common()]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--seats", type=int, default=1024)
    p.add_argument("--num-prompts", type=int, default=workloads.W4_NUM_REQUESTS)
    p.add_argument("--output-len", type=int, default=4)
    p.add_argument("--min-gap-ms", type=float, default=0.5)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--mixed-ahead", choices=["on", "off"],
                   default="on" if EngineArgs(model="m").schedule_mixed_ahead else "off")
    p.add_argument("--syncs", action="store_true", help="the synchronizing CUDA calls of one more run, by call site")
    p.add_argument("--traces", nargs="*", choices=["plain", "python"], default=["plain", "python"],
                   help="which profiles to take (a whole W4 run with Python stacks is a very large trace; "
                        "none: --syncs alone)")
    args = p.parse_args()
    mixed_ahead = args.mixed_ahead == "on"
    llm = LLM(model=str(workloads.resolve_model("w4")), load_format="dummy", max_model_len=2048,
              max_num_seqs=args.seats, seed=0, schedule_mixed_ahead=mixed_ahead)
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    warm = [r.prompt_token_ids for r in workloads.offline_requests(args.num_prompts, 16, seed=1)]
    prompts = [r.prompt_token_ids for r in workloads.offline_requests(args.num_prompts, 16, seed=0)]
    llm.generate(prompt_token_ids=warm, sampling_params=params, use_tqdm=False)
    result = {"commit": os.environ.get("PAGODA_COMMIT", "unknown"), "gpu": torch.cuda.get_device_name(),
              "seats": args.seats, "num_prompts": args.num_prompts, "output_len": args.output_len,
              "min_gap_ms": args.min_gap_ms, "mixed_ahead": mixed_ahead}
    tmp = Path(tempfile.mkdtemp(prefix="w4-gaps-"))
    for name, stack, cats in (("plain", False, {"cpu_op", "cuda_runtime", "cuda_driver"}),
                              ("python", True, {"python_function"})):
        if name not in args.traces:
            continue
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=stack) as prof:
            llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
            torch.cuda.synchronize()
        trace = tmp / f"{name}.json"
        prof.export_chrome_trace(str(trace))
        result[name] = gap_report(trace, cats, args.min_gap_ms * 1e3, args.top)
        r = result[name]
        print(f"{name}: busy {r.get('gpu_busy_share')} of {r.get('window_ms')} ms, {r.get('gaps')} gaps, "
              f"{r.get('gap_ms_total')} ms; largest {r.get('gap_ms_largest', [])[:8]}; lead {r.get('lead_ms')} ms, "
              f"tail {r.get('tail_ms')} ms, gaps by tenth {r.get('gap_ms_by_tenth')}", flush=True)
        for row in r.get("host_in_gaps", [])[:25]:
            print(f"   {row['ms']:9.2f} ms {row['events']:7d}  {row['name'][:150]}", flush=True)
    if args.syncs:
        result["syncs"] = sync_sites(lambda: llm.generate(prompt_token_ids=prompts, sampling_params=params,
                                                          use_tqdm=False), llm)
        print("synchronizing calls by site:", json.dumps(result["syncs"]["sites"][:10], indent=1), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"w4-gaps-{result['commit']}{'-mixed-ahead' if mixed_ahead else ''}.json"
    path.write_text(json.dumps(result, indent=1))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
