"""The vLLM peer on W1 and W4, offline, through vLLM's own `LLM` class: the same request lists, the
same warm-up rule and the same figure as `pagoda bench throughput`, so that a ratio to vLLM comes
from one call on one machine (BENCHMARKS.md).

Run it with vLLM's packages (../shared/tools/vllm-peer) and without Pagoda's /tmp/site on the path:
    PYTHONPATH=/tmp/vsite:/tmp/pagoda-src HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \\
        python3 e2e/vllm_peer.py --workload W4 --model-dir DIR --out OUT [--max-num-seqs 256]

DIR is the folder `pagoda bench model w4` writes (config.json + tokenizer, random weights here).
Only pagoda.runtime.tools.bench.workloads is imported from Pagoda (plain Python).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

from pagoda.runtime.tools.bench import workloads


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=sorted(workloads.WORKLOADS), default="W4")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-num-seqs", type=int, default=None, help="default: vLLM's own")
    p.add_argument("--output-len", type=int, default=workloads.W1_OUTPUT_LEN)
    p.add_argument("--warmup-tokens", type=int, default=16)
    args = p.parse_args()

    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    requests = workloads.WORKLOADS[args.workload](0)
    warm = workloads.offline_requests(len(requests), args.warmup_tokens, seed=1)
    extra = {} if args.max_num_seqs is None else {"max_num_seqs": args.max_num_seqs}
    llm = LLM(model=args.model_dir, load_format="dummy", max_model_len=2048, seed=0,
              gpu_memory_utilization=0.9, **extra)
    llm.generate([TokensPrompt(prompt_token_ids=r.prompt_token_ids) for r in warm],
                 SamplingParams(temperature=0, max_tokens=args.warmup_tokens, ignore_eos=True), use_tqdm=False)
    torch.cuda.synchronize()
    prompts = [TokensPrompt(prompt_token_ids=r.prompt_token_ids) for r in requests]
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    result = {
        "workload": args.workload, "backend": "vllm", "vllm": vllm.__version__,
        "gpu": torch.cuda.get_device_name(), "commit": os.environ.get("PAGODA_COMMIT", "unknown"),
        "torch": torch.__version__, "triton": _version("triton"), "date": datetime.now(timezone.utc).isoformat(),
        "command": "python3 e2e/vllm_peer.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                                          if v is not None and k != "out"),
        "max_num_seqs": args.max_num_seqs or "vllm default", "num_prompts": len(requests),
        "output_len": args.output_len, "elapsed_s": elapsed, "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / elapsed,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seats = args.max_num_seqs or "default"
    path = out / f"{args.workload}-vllm-seats{seats}.json"
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps(result), flush=True)
    return 0


def _version(name: str) -> str:
    try:
        return __import__(name).__version__
    except ImportError:
        return "absent"


if __name__ == "__main__":
    raise SystemExit(main())
