"""Host CPU per full decode step, as quantiles over every step of several W4 runs on the CPU stub.

    python e2e/host_path_quantiles.py --out DIR [--runs 3] [--tag T]

host_path_bench.py's stub engine (the real frontend, scheduler, KV manager, batch builder and
sampler bookkeeping; a model that returns at once) at 1,024 seats. A shared machine's speed moves
by tens of percent between runs, which its per-run means carry; the low quantiles of the per-step
thread CPU time (steps whose launches were all decode steps over at least 900 rows) move much less,
so two commits are compared by alternating calls of this script, one per commit (PYTHONPATH
pointing at the other checkout). Writes host-quantiles-<commit>[-T].json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
import host_path_bench as bench  # noqa: E402

from pagoda.runtime.tools.bench import workloads  # noqa: E402

QUANTILES = (0.05, 0.10, 0.25, 0.50)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--tag", default="")
    args = p.parse_args()
    llm = bench.build_llm(1024, 80000, mixed_ahead=True)
    bench.run_once(llm, [r.prompt_token_ids for r in workloads.offline_requests(1024, 8, seed=1)], 8)  # warm
    steps, medians = [], []
    for i in range(args.runs):
        timer = bench.StepTimer(llm)
        prompts = [r.prompt_token_ids for r in workloads.offline_requests(1024, 1, seed=10 + i)]
        bench.run_once(llm, prompts, workloads.W1_OUTPUT_LEN, timer)
        cpu = [c * 1e3 for _, c, _, launches in timer.calls
               if launches and all(k == "decode" for k, _ in launches) and sum(n for _, n in launches) >= 900]
        medians.append(round(statistics.median(cpu), 3))
        steps += cpu
    steps.sort()
    result = {"commit": bench.commit(),
              "runs": args.runs, "decode_steps": len(steps), "run_medians_cpu_ms": medians,
              **{f"p{int(q * 100):02d}_cpu_ms": round(steps[int(q * (len(steps) - 1))], 3) for q in QUANTILES}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"host-quantiles-{result['commit']}{'-' + args.tag if args.tag else ''}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
