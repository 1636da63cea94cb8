"""W4's host path on the CPU: what one engine step costs the host when the GPU takes no time.

    python e2e/host_path_bench.py --out DIR [--seats 256 1024] [--num-prompts 1024] [--repeat 3]
                                  [--cprofile] [--stages] [--mixed-ahead on|off]

The real LLM frontend, InputProcessor, OutputProcessor, scheduler, KV manager, ModelRunner (batch
builder, input buffers, decode-graph padding, sampler bookkeeping) run W4's requests (the 0.5B
model's shape and tokenizer, 128-1024 token prompts, 256 greedy output tokens, ignore_eos), with
the model replaced by a stub that returns at once: zero hidden states, and logits of 64 columns
whose argmax maps to ids spread over the vocabulary. So every step's wall time here is host work,
which on the H200 must stay under the GPU's time per step (about 2.6 ms at 256 seats, 8 ms at 1024)
for the GPU never to wait.

Per seat count it reports the host milliseconds per decode step (engine steps whose launches were
all decode steps: total time of those LLMEngine.step calls / decode launches), per request and
step, and the same for steps with prefill rows: wall, step-thread CPU and process CPU time (the
last also counts what other threads did for the step, e.g. tokenizers' decode_batch). `--stages`
adds a table of the time in each part of the step (timers around the main functions; they add a
little overhead), `--cprofile` a cProfile table of one run, `--mixed-ahead on|off` schedules mixed steps ahead or not
(`--schedule-mixed-ahead`, the engine's default since 9213c1e and so the bench's; the file name ends in
-mixed-ahead when on). The machine is shared: each setting
runs --repeat times and the JSON holds every run, the median and the load average. Writes
host-path-<commit>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from pagoda.runtime.core import engine_core
from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.frontend.llm import LLM
from pagoda.runtime.sampling_params import SamplingParams
from pagoda.runtime.tools.bench import workloads
from pagoda.runtime.worker import model_runner
from pagoda.runtime.worker.executor import LocalExecutor, runner_options
from pagoda.runtime.worker.sampler import Sampler

STUB_VOCAB = 64  # logits columns the stub hands the real sampler


class StubModel(torch.nn.Module):
    """The model's interface with no work behind it."""

    def __init__(self, token_map: torch.Tensor):
        super().__init__()
        self.token_map = token_map
        self.calls = 0

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return torch.zeros(input_ids.shape[0], 1)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # Different winners per row and per call, cheaply: a rolled identity-like pattern.
        self.calls += 1
        n = hidden.shape[0]
        rows = (torch.arange(n) * 7 + self.calls * 13) % STUB_VOCAB
        logits = torch.zeros(n, STUB_VOCAB)
        logits[torch.arange(n), rows] = 1.0
        return logits


class StubSampler(Sampler):
    """The real sampler's host bookkeeping, on the stub's narrow logits; its ids are then spread
    over the workload's token range, so the detokenizer sees ordinary tokens."""

    token_map: torch.Tensor

    def sample(self, logits, requests, pending=0):
        tokens, logprobs = super().sample(logits, requests, pending)
        return self.token_map[tokens], logprobs


class StubRunner(model_runner.ModelRunner):
    """A ModelRunner whose model is StubModel and whose KV cache is not allocated."""

    def _bind_kv_cache(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size


def stub_executor(cfg, device, args, max_num_batched_tokens, pooling_type=None):
    gen = torch.Generator().manual_seed(0)
    token_map = torch.randint(*workloads.TOKEN_ID_RANGE, (STUB_VOCAB,), generator=gen)
    real_load = model_runner.load_model
    model_runner.load_model = lambda *a, **k: StubModel(token_map)
    try:
        runner = StubRunner(cfg, device, **runner_options(args), max_num_batched_tokens=max_num_batched_tokens,
                            pooling_type=pooling_type)
    finally:
        model_runner.load_model = real_load
    sampler = StubSampler(cfg.vocab_size, device, args.seed)
    sampler.token_map = token_map
    runner.sampler = sampler
    return LocalExecutor(runner)


@contextlib.contextmanager
def stubbed_engine():
    real = engine_core.build_executor
    engine_core.build_executor = stub_executor
    try:
        yield
    finally:
        engine_core.build_executor = real


def build_llm(seats: int, num_kv_blocks: int, mixed_ahead: bool = False) -> LLM:
    model = workloads.resolve_model("w4")
    with stubbed_engine():
        # The H200's settings for W4: 16k token budget (offline, big GPU), graphs for decode and
        # mixed steps (padding and buckets are host logic), async scheduling.
        return LLM(model=str(model), load_format="dummy", device="cpu", max_model_len=2048, max_num_seqs=seats,
                   max_num_batched_tokens=16384, num_kv_blocks=num_kv_blocks, seed=0,
                   schedule_mixed_ahead=mixed_ahead)


def step_kind(sched) -> str:
    return "decode" if sched.total_num_tokens == len(sched.scheduled) else "prefill"


class StepTimer:
    """Times each LLMEngine.step call and counts the launches it made, by kind."""

    def __init__(self, llm: LLM):
        engine = llm.llm_engine
        self.runner = engine.runner
        self.calls: list[tuple[float, list[tuple[str, int]]]] = []
        self._launches: list[tuple[str, int]] = []
        orig_step, orig_launch = engine.step, self.runner.launch

        def launch(sched, kv, *previous):
            self._launches.append((step_kind(sched), len(sched.scheduled)))
            return orig_launch(sched, kv, *previous)

        def step():
            self._launches = []
            t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
            out = orig_step()
            self.calls.append((time.perf_counter() - t0, time.thread_time() - c0, time.process_time() - p0,
                               self._launches))
            return out

        engine.step, self.runner.launch = step, launch

    def summary(self) -> dict:
        kinds: dict[str, dict] = {}
        per_call: dict[str, list[float]] = {}
        for seconds, cpu, proc, launches in self.calls:
            if not launches:
                # A call that only read the step launched ahead by the one before: its time belongs
                # to the kind of that step (decode: nothing else is launched ahead).
                kind = "decode"
            else:
                kind = "decode" if all(k == "decode" for k, _ in launches) else "prefill"
            k = kinds.setdefault(kind, {"calls": 0, "launches": 0, "rows": 0, "host_s": 0.0, "cpu_s": 0.0,
                                        "proc_cpu_s": 0.0})
            k["calls"] += 1
            k["cpu_s"] += cpu
            k["proc_cpu_s"] += proc
            per_call.setdefault(kind, []).append(cpu)
            k["launches"] += len(launches)
            k["rows"] += sum(n for _, n in launches)
            k["host_s"] += seconds
        for k in kinds.values():
            k["host_ms_per_step"] = round(k["host_s"] * 1e3 / max(k["launches"], 1), 4)
            k["mean_rows"] = round(k["rows"] / max(k["launches"], 1), 1)
            k["host_us_per_row"] = round(k["host_s"] * 1e6 / max(k["rows"], 1), 3)
            # The thread's CPU time: less sensitive than the wall time to other processes on a
            # shared machine (what it still counts: cache misses they cause).
            k["cpu_ms_per_step"] = round(k["cpu_s"] * 1e3 / max(k["launches"], 1), 4)
            k["cpu_us_per_row"] = round(k["cpu_s"] * 1e6 / max(k["rows"], 1), 3)
            # The process's CPU time: also what other threads did for the step (tokenizers'
            # decode_batch spreads over cores; the step thread's figure leaves that out).
            k["proc_cpu_ms_per_step"] = round(k["proc_cpu_s"] * 1e3 / max(k["launches"], 1), 4)
            k["host_s"], k["cpu_s"] = round(k["host_s"], 4), round(k["cpu_s"], 4)
            k["proc_cpu_s"] = round(k["proc_cpu_s"], 4)
        for kind, cpus in per_call.items():
            # The slowest calls: a step whose host work outlasts the GPU's leaves the GPU idle, which
            # an average hides (e.g. a whole wave of requests finishing, and detokenized, at once).
            cpus.sort()
            kinds[kind]["cpu_ms_p99_call"] = round(cpus[int(0.99 * (len(cpus) - 1))] * 1e3, 3)
            kinds[kind]["cpu_ms_max_call"] = round(cpus[-1] * 1e3, 3)
        return kinds


STAGES = [
    ("scheduler", "pagoda.runtime.core.scheduler", "Scheduler", "schedule"),
    ("scheduler", "pagoda.runtime.core.scheduler", "Scheduler", "schedule_ahead"),
    ("scheduler", "pagoda.runtime.core.scheduler", "Scheduler", "update_from_output"),
    ("runner", "pagoda.runtime.worker.input_batch", "BatchBuilder", "build"),
    ("runner", "pagoda.runtime.worker.model_runner", "ModelRunner", "_feed_in_flight_tokens"),
    ("runner", "pagoda.runtime.worker.sampler", "Sampler", "sample"),
    ("runner", "pagoda.runtime.worker.model_runner", "PendingStep", "wait"),
    ("core", "pagoda.runtime.core.engine_core", "EngineCore", "_outputs"),
    ("frontend", "pagoda.runtime.frontend.output_processor", "OutputProcessor", "process_outputs"),
    ("frontend", "pagoda.runtime.frontend.output_processor", "OutputProcessor", "_finish"),
    ("frontend", "pagoda.runtime.frontend.output_processor", "OutputProcessor", "_make_output"),
    ("frontend", "pagoda.runtime.frontend.llm_engine", "LLMEngine", "add_request"),
]


@contextlib.contextmanager
def stage_timers(clock=time.thread_time, extra=()):
    """Accumulate the time (thread CPU by default) of each STAGES function and of `extra`'s
    (exclusive of nothing: nested stages, such as _make_output inside process_outputs, are also
    inside their caller's figure)."""
    import importlib

    totals: dict[str, list] = {}
    saved = []
    for _, module, cls_name, name in [*STAGES, *extra]:
        cls = getattr(importlib.import_module(module), cls_name)
        orig = cls.__dict__[name]
        key = f"{cls_name}.{name}"
        acc = totals.setdefault(key, [0.0, 0])

        def timed(*a, _orig=orig, _acc=acc, **kw):
            t0 = clock()
            try:
                return _orig(*a, **kw)
            finally:
                _acc[0] += clock() - t0
                _acc[1] += 1

        functools.update_wrapper(timed, orig)
        setattr(cls, name, timed)
        saved.append((cls, name, orig))
    try:
        yield totals
    finally:
        for cls, name, orig in saved:
            setattr(cls, name, orig)


def run_once(llm: LLM, prompts: list[list[int]], output_len: int, timer: StepTimer | None = None
             ) -> tuple[dict, float]:
    """One W4 generate under a StepTimer (the caller's, to read its per-call times after)."""
    timer = timer or StepTimer(llm)
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    wall = time.perf_counter() - t0
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    assert tokens == len(prompts) * output_len, tokens
    engine = llm.llm_engine
    del engine.step, engine.runner.launch  # back to the class's methods
    return {"wall_s": round(wall, 3), "output_tokens": tokens, "steps": timer.summary()}, wall


def load() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def commit() -> str:
    if os.environ.get("PAGODA_COMMIT"):
        return os.environ["PAGODA_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--seats", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--num-prompts", type=int, default=workloads.W4_NUM_REQUESTS)
    p.add_argument("--output-len", type=int, default=workloads.W1_OUTPUT_LEN)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--num-kv-blocks", type=int, default=80000)
    p.add_argument("--stages", action="store_true", help="a per-stage time table (one more run per seat count)")
    p.add_argument("--cprofile", action="store_true", help="a cProfile table (one more run per seat count)")
    engine_default = "on" if EngineArgs(model="m").schedule_mixed_ahead else "off"
    p.add_argument("--mixed-ahead", choices=["on", "off"], default=engine_default,
                   help="schedule mixed steps ahead too (Scheduler._mixed_ahead), as an A/B "
                        "(default: the engine's, %(default)s)")
    args = p.parse_args()
    mixed_ahead = args.mixed_ahead == "on"
    torch.set_num_threads(1)
    result = {"commit": commit(), "python": sys.version.split()[0], "torch": torch.__version__,
              "num_prompts": args.num_prompts, "output_len": args.output_len, "load_before": load(),
              "mixed_ahead": mixed_ahead, "seats": {}}
    for seats in args.seats:
        llm = build_llm(seats, args.num_kv_blocks, mixed_ahead)
        warm = [r.prompt_token_ids for r in workloads.offline_requests(min(args.num_prompts, seats), 8, seed=1)]
        llm.generate([{"prompt_token_ids": q} for q in warm],
                     SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
        runs = []
        for i in range(args.repeat):
            # A fresh draw each time: the prefix cache holds the last one.
            prompts = [r.prompt_token_ids for r in workloads.offline_requests(args.num_prompts, 1, seed=10 + i)]
            run, _ = run_once(llm, prompts, args.output_len)
            run["load"] = load()
            runs.append(run)
            print(f"seats {seats} run {i}: {json.dumps(run)}", flush=True)
        entry = {"runs": runs}
        for kind in ("decode", "prefill"):
            for figure in ("host_ms_per_step", "host_us_per_row", "cpu_ms_per_step", "cpu_us_per_row",
                           "proc_cpu_ms_per_step", "cpu_ms_p99_call", "cpu_ms_max_call"):
                values = [r["steps"][kind][figure] for r in runs if kind in r["steps"]]
                if values:
                    entry[f"{kind}_{figure}_median"] = statistics.median(values)
        entry["wall_s_median"] = statistics.median(r["wall_s"] for r in runs)
        if args.stages:
            prompts = [r.prompt_token_ids for r in workloads.offline_requests(args.num_prompts, 1, seed=90)]
            with stage_timers() as totals:
                run, wall = run_once(llm, prompts, args.output_len)
            launches = sum(k["launches"] for k in run["steps"].values())
            entry["stages"] = {"wall_s": round(wall, 3), "launches": launches,
                               "per_step_ms": {k: round(v[0] * 1e3 / launches, 4) for k, v in totals.items()},
                               "calls": {k: v[1] for k, v in totals.items()}}
            for k, v in sorted(totals.items(), key=lambda kv: -kv[1][0]):
                print(f"  {k:40s} {v[0] * 1e3 / launches:8.4f} CPU ms/step  ({v[1]} calls)", flush=True)
        if args.cprofile:
            prompts = [r.prompt_token_ids for r in workloads.offline_requests(args.num_prompts, 1, seed=91)]
            prof = cProfile.Profile()
            prof.enable()
            run, wall = run_once(llm, prompts, args.output_len)
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(40)
            entry["cprofile"] = {"wall_s": round(wall, 3), "table": buf.getvalue()}
            print(buf.getvalue(), flush=True)
        result["seats"][str(seats)] = entry
        print(f"seats {seats}: decode {entry.get('decode_host_ms_per_step_median')} ms/step "
              f"({entry.get('decode_cpu_ms_per_step_median')} CPU), {entry.get('decode_host_us_per_row_median')} "
              f"us/row/step ({entry.get('decode_cpu_us_per_row_median')} CPU), slowest decode call "
              f"{entry.get('decode_cpu_ms_max_call_median')} CPU ms, prefill steps "
              f"{entry.get('prefill_host_ms_per_step_median')} ms (median of {args.repeat})", flush=True)
        llm.shutdown()
    result["load_after"] = load()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"host-path-{result['commit']}{'-mixed-ahead' if mixed_ahead else ''}.json"
    path.write_text(json.dumps(result, indent=1))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
