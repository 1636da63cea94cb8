"""W5 through vLLM's own LLM class: the peer of `pagoda bench throughput --workload W5`.

Runs in vLLM's environment (PYTHONPATH=/tmp/vsite, see ../shared/tools/vllm-peer/README.md) with
only the standard-library parts of Pagoda on the path (/tmp/pagoda-src, made by e2e/gpu_env.sh):
the request draw (tools/bench/workloads.py), the roofline and the result file. vLLM runs with its defaults
and load_format="dummy" (random bf16 weights), on the W5 folder that `pagoda bench model w5` wrote,
on the same prompt token ids, after a warm-up of as many requests from another draw (16 tokens
each), as Pagoda's bench does. The figure is output tokens over the wall time of one generate().

    PYTHONPATH=/tmp/vsite:/tmp/pagoda-src python3 e2e/w5_vllm_peer.py --model DIR --out DIR \\
        [--pagoda-result W5-pagoda-*.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    from pagoda.runtime.tools.bench import workloads
    from pagoda.runtime.tools.bench.results import write_result
    from pagoda.runtime.tools.bench.roofline import offline_roofline

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the W5 folder (pagoda bench model w5)")
    parser.add_argument("--out", default="e2e/results")
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--output-len", type=int, default=workloads.W1_OUTPUT_LEN)
    parser.add_argument("--pagoda-result", default=None, help="Pagoda's W5 JSON from the same call: adds the ratio")
    args = parser.parse_args(argv)

    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    requests = workloads.WORKLOADS["W5"](0)
    full_count = len(requests)
    if args.num_prompts:
        requests = requests[: args.num_prompts]
    warm = workloads.offline_requests(len(requests), 16, seed=1)
    t0 = time.perf_counter()
    llm = LLM(model=args.model, load_format="dummy", dtype="bfloat16", max_model_len=2048, seed=0)
    startup_s = time.perf_counter() - t0

    def prompts(reqs):
        return [TokensPrompt(prompt_token_ids=r.prompt_token_ids) for r in reqs]

    llm.generate(prompts(warm), SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts(requests), params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    config = workloads.load_config(args.model)
    roof = offline_roofline(config, [len(r.prompt_token_ids) for r in requests], args.output_len)
    tok_per_s = output_tokens / elapsed
    record = {
        "workload": "W5",
        "backend": "vllm",
        "vllm": vllm.__version__,
        "command": "python3 " + " ".join(sys.argv),
        "engine_args": {"load_format": "dummy", "dtype": "bfloat16", "max_model_len": 2048, "seed": 0,
                        "other": "vLLM defaults"},
        "num_prompts": len(requests),
        "workload_num_prompts": full_count,
        "capped": len(requests) < full_count,
        "output_len": args.output_len,
        "output_tokens": output_tokens,
        "elapsed_s": elapsed,
        "startup_s": startup_s,
        "output_tokens_per_s": tok_per_s,
        "roofline_output_tokens_per_s": roof.output_tokens_per_s,
        "ratio_to_roofline": tok_per_s / roof.output_tokens_per_s,
        "roofline": roof.to_dict(),
    }
    if args.pagoda_result:
        pagoda = json.loads(Path(args.pagoda_result).read_text())
        record["pagoda_output_tokens_per_s"] = pagoda["output_tokens_per_s"]
        record["pagoda_result"] = Path(args.pagoda_result).name
        record["pagoda_to_vllm"] = pagoda["output_tokens_per_s"] / tok_per_s
        print(f"pagoda / vllm: {record['pagoda_to_vllm']:.3f}x")
    print(f"W5 vllm {vllm.__version__}: {output_tokens} tokens in {elapsed:.2f} s = {tok_per_s:,.1f} tok/s; "
          f"roofline {roof.output_tokens_per_s:,.0f} ({record['ratio_to_roofline']:.1%}); start {startup_s:.0f} s")
    write_result(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
