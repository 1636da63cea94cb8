"""W3 at full load without HTTP: the engine alone, stepped as the server's engine process steps it.

    python e2e/profile_w3.py --out DIR [--max-num-seqs 256] [--mnbt 8192]

Run one --max-num-seqs per process: an engine sizes its KV pool to the whole GPU.

All 512 W3 requests (W1's prompt lengths, outputs randint(64, 512), EOS ignored) are added at once
to an EngineCore, which is then stepped, each step's EngineCoreOutputs pickled exactly as
core/engine_proc.py does before its socket send. The figure is the
ceiling the served run could reach if HTTP, tokenization and the load generator cost nothing; the
served/offline gap splits into (this figure vs served) = the server side, and (W1 vs this figure)
= what the engine loses to admission churn and the drain at the end. Per-step GPU time, GPU idle
and step kinds come from profile_gpu.StepRecorder; the host time spent encoding and pickling is
summed separately. Writes profile-w3-<commit>.json into --out.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from profile_gpu import StepRecorder, step_kind  # noqa: E402

from pagoda.runtime.core.engine_core import EngineCore, EngineCoreRequest  # noqa: E402
from pagoda.runtime.engine_args import EngineArgs  # noqa: E402
from pagoda.runtime.sampling_params import SamplingParams  # noqa: E402
from pagoda.runtime.tools.bench import workloads  # noqa: E402
from pagoda.runtime.worker.model_runner import PendingStep  # noqa: E402


class HostStages:
    """Host seconds per stage of the step loop, and in Python's garbage collector. The launch is
    split by step kind: an eager (prefill or mixed) step launches every kernel from Python."""

    def __init__(self, engine: EngineCore):
        self.totals: dict[str, float] = {}
        sched, runner = engine.scheduler, engine.executor.runner
        for obj, name in ((sched, "schedule"), (sched, "schedule_ahead"), (sched, "update_from_output"),
                          (engine, "_outputs")):
            setattr(obj, name, self._timed(name, getattr(obj, name)))
        launch = runner.launch

        def timed_launch(sched_out, *a):
            t0 = time.perf_counter()
            try:
                return launch(sched_out, *a)
            finally:
                self._add(f"launch_{step_kind(sched_out)}", time.perf_counter() - t0)

        runner.launch = timed_launch
        self._wait = PendingStep.wait
        PendingStep.wait = self._timed("wait", PendingStep.wait)
        self._gc_start = 0.0
        gc.callbacks.append(self._on_gc)

    def _add(self, name: str, seconds: float) -> None:
        self.totals[name] = self.totals.get(name, 0.0) + seconds

    def _timed(self, name, fn):
        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self._add(name, time.perf_counter() - t0)
        return timed

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self._add(f"gc_gen{info.get('generation')}", time.perf_counter() - self._gc_start)

    def take(self) -> dict:
        out, self.totals = {k: round(v, 3) for k, v in sorted(self.totals.items())}, {}
        return out

    def close(self) -> None:
        PendingStep.wait = self._wait
        gc.callbacks.remove(self._on_gc)


def run_load(engine: EngineCore, recorder: StepRecorder, requests, tag: str) -> dict:
    """What the engine process does: core steps, each one's records pickled for the server."""
    now = time.monotonic()
    for i, r in enumerate(requests):
        params = SamplingParams(temperature=0, max_tokens=r.output_len, min_tokens=r.output_len, ignore_eos=True)
        engine.add_request(EngineCoreRequest(f"{tag}-{i}", list(r.prompt_token_ids), params, None, r.output_len, now))
    torch.cuda.synchronize()
    recorder.reset()
    encode_s, steps, batch_sum = 0.0, 0, 0
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        outputs = engine.step()
        t1 = time.perf_counter()
        pickle.dumps(("step", [], outputs, None), pickle.HIGHEST_PROTOCOL)
        encode_s += time.perf_counter() - t1
        steps += 1
        batch_sum += len(engine.scheduler.running)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    result = recorder.summary(wall)
    tokens = sum(r.output_len for r in requests)
    result.update(output_tokens=tokens, output_tokens_per_s=round(tokens / wall, 1), engine_steps=steps,
                  mean_running=round(batch_sum / max(steps, 1), 1), encode_pickle_s=round(encode_s, 3))
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--max-num-seqs", type=int, nargs="+", default=[256],
                   help="0 = the engine's default for this GPU")
    p.add_argument("--mnbt", type=int, default=8192, help="the server's default token budget")
    p.add_argument("--num-requests", type=int, default=workloads.W3_NUM_REQUESTS)
    args = p.parse_args()
    model = workloads.resolve_model("w1")
    requests = workloads.serving_requests(args.num_requests, seed=0)
    warm = workloads.offline_requests(256, 16, seed=1)
    result = {"commit": os.environ.get("PAGODA_COMMIT", "unknown"), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "num_requests": args.num_requests, "max_num_batched_tokens": args.mnbt,
              "runs": {}}
    for seqs in args.max_num_seqs:
        engine = EngineCore(EngineArgs(
            model=str(model), load_format="dummy", max_model_len=2048, max_num_batched_tokens=args.mnbt,
            max_num_seqs=seqs or None, seed=0))
        gc.collect()
        gc.freeze()  # as core/engine_proc.py does once the engine is built
        recorder = StepRecorder(engine)
        stages = HostStages(engine)
        run_load(engine, recorder, warm, "warm")
        stages.take()
        result["runs"][str(seqs)] = run_load(engine, recorder, requests, "w3")
        result["runs"][str(seqs)]["host_stage_s"] = stages.take()
        stages.close()
        print("W3 engine-only, max_num_seqs", seqs, json.dumps(result["runs"][str(seqs)]), flush=True)
        # Written after every run: a later run that fails (one engine's KV pool is sized to the
        # whole GPU, and the next may not fit beside its leftovers) must not lose this one.
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"profile-w3-{result['commit']}-{'-'.join(map(str, args.max_num_seqs))}.json"
        path.write_text(json.dumps(result, indent=1))
        print("wrote", path, flush=True)
        engine.shutdown()
        del engine, recorder
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
