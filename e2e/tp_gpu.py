"""Tensor parallelism on a multi-GPU host: correctness, W1 at TP=2 against TP=1, and a 70B shape.

Run from the repository root on a host with 2, 4 or 8 GPUs (after `source e2e/gpu_env.sh`):
    python e2e/tp_gpu.py --out e2e/results/tp_gpu-$(date +%Y%m%d-%H%M%S).json [--parts correctness w1 big]

Each configuration runs in a child process of its own (a fresh CUDA context and process group, and
every GPU free again for the next one). Dummy weights are drawn in the checkpoint's own shapes from
one seeded generator (model_loader.dummy_weights), so TP=1 and TP=N run the same random model.

1. correctness: the W1 architecture cut to a few layers, in fp32 (and bf16, reported only), 16
   prompts, 32 greedy tokens, TP=1 against each TP=N that fits. fp32 must agree token for token,
   except where TP=1's own top-2 margin at the first differing token is below FP32_TIE nats (the
   ranks sum the row-parallel outputs in another order). Logprobs of the agreeing prefix are
   compared too.
2. w1: BENCHMARKS.md's W1 (256 requests, 256 output tokens, Llama-3.1-8B shape, bf16) at TP=1 and
   TP=2: output tokens/s and their ratio.
3. big: a Llama-3.1-70B shape (random bf16 weights) at TP=4 and TP=8 where the GPUs exist: W1's
   requests (--big-prompts of them), output tokens/s, and the all-reduce share of step time from
   the torch profiler on rank 0 over --profile-steps decode steps (NCCL kernel time over all GPU
   kernel time, and over the steps' wall time).
The JSON goes to --out; the exit status is 0 only when every correctness check passes.
`--smoke` runs every part with tiny shapes on the CPU over gloo, to check this script without GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FP32_TIE = 1e-3  # nats
NUM_PROMPTS, NUM_TOKENS, CORRECTNESS_LAYERS = 16, 32, 4
CHILD_TIMEOUT_S = 580  # one device call runs at most 10 minutes

LLAMA_3_1_70B = {
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="e2e/results/tp_gpu.json", help="where the JSON goes")
    p.add_argument(
        "--parts", nargs="+", default=["correctness", "w1", "big"], choices=["correctness", "w1", "big"]
    )
    p.add_argument(
        "--sizes", nargs="+", type=int, default=[2, 4, 8], help="TP sizes for correctness (those that fit)"
    )
    p.add_argument("--big-sizes", nargs="+", type=int, default=[4, 8], help="TP sizes for the 70B shape")
    p.add_argument("--w1-prompts", type=int, default=256, help="W1 requests (256 = the benchmark)")
    p.add_argument("--big-prompts", type=int, default=256, help="W1 requests for the 70B shape")
    p.add_argument(
        "--profile-steps", type=int, default=16, help="decode steps profiled for the all-reduce share"
    )
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (if capture over NCCL fails)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (gloo), to check the script")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---- children: one engine each -------------------------------------------------------------------


def model_dir(root: Path, name: str, overrides: dict, smoke: bool) -> Path:
    """config.json + the bench's synthetic tokenizer; weights are dummy."""
    from pagoda.runtime.tools.bench import workloads

    base = "tiny" if smoke else "w1"
    path = root / name
    if not (path / "config.json").exists():
        folder = workloads.model_folder(base, path)
        config = {**workloads.MODEL_CONFIGS[base], **overrides}
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path


def make_llm(job: dict):
    from pagoda.runtime.frontend.llm import LLM

    return LLM(
        job["model"], load_format="dummy", dtype=job["dtype"], device=job["device"],
        max_model_len=job["max_model_len"], tensor_parallel_size=job["tp"],
        enforce_eager=job["enforce_eager"], seed=0, max_num_seqs=job.get("max_num_seqs", 256),
    )  # fmt: skip


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def child_correctness(job: dict) -> dict:
    from pagoda.runtime.sampling_params import SamplingParams

    llm = make_llm(job)
    params = SamplingParams(temperature=0.0, max_tokens=job["num_tokens"], ignore_eos=True, logprobs=2)
    outs = llm.generate(prompt_token_ids=job["prompts"], sampling_params=params, use_tqdm=False)
    llm.shutdown()
    result = []
    for o in outs:
        c = o.outputs[0]
        # Per step: the top two (token, logprob) pairs, best first.
        top = [
            sorted(((t, lp.logprob) for t, lp in step.items()), key=lambda x: -x[1])[:2]
            for step in c.logprobs
        ]
        result.append({"token_ids": c.token_ids, "top2": top})
    return {"outputs": result}


def allreduce_share(llm, steps: int) -> dict:
    """Profile rank 0 over `steps` decode steps of a running batch."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    engine = llm.llm_engine
    while engine.scheduler.waiting or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running
    ):
        engine.step()  # until every request is past its prompt: pure decode steps from here
    for _ in range(3):
        engine.step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    sync()
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            engine.step()
        sync()
    wall = time.perf_counter() - start
    total = allreduce = other_nccl = 0.0
    for evt in prof.key_averages():
        if evt.device_type != DeviceType.CUDA:  # kernels only: CPU ops would count them twice
            continue
        us = getattr(evt, "self_device_time_total", None) or getattr(evt, "self_cuda_time_total", 0) or 0
        total += us
        name = evt.key.lower()
        if "nccl" in name:
            if "allreduce" in name:
                allreduce += us
            else:
                other_nccl += us  # the logits gather onto rank 0
    return {
        "profiled_decode_steps": steps,
        "batch_size": len(engine.scheduler.running),
        "step_ms": wall / steps * 1e3,
        "gpu_kernel_ms_per_step": total / steps / 1e3,
        "allreduce_ms_per_step": allreduce / steps / 1e3,
        "other_nccl_ms_per_step": other_nccl / steps / 1e3,
        "allreduce_share_of_gpu_time": allreduce / total if total else None,
        "allreduce_share_of_step_time": allreduce / 1e6 / wall if wall else None,
    }


def child_throughput(job: dict) -> dict:
    from pagoda.runtime.sampling_params import SamplingParams
    from pagoda.runtime.tools.bench import workloads

    llm = make_llm(job)
    requests = workloads.w1_requests()[: job["num_prompts"]]
    warm = workloads.offline_requests(len(requests), 16, seed=1)
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in warm]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    params = SamplingParams(temperature=0, max_tokens=job["output_len"], ignore_eos=True)
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
    sync()
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    sync()
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    result = {
        "tp": job["tp"],
        "num_prompts": len(requests),
        "output_tokens": tokens,
        "elapsed_s": elapsed,
        "output_tokens_per_s": tokens / elapsed,
        "kv_capacity_tokens": llm.llm_engine.stats().kv_capacity_tokens,
        "num_preemptions": llm.llm_engine.stats().num_preemptions,
    }
    if job.get("profile_steps"):
        again = workloads.offline_requests(len(requests), job["output_len"], seed=2)
        for i, r in enumerate(again):
            llm.llm_engine.add_request(f"p{i}", None, r.prompt_token_ids, params)
        result.update(allreduce_share(llm, job["profile_steps"]))
        while llm.llm_engine.has_unfinished_requests():
            llm.llm_engine.step()
    llm.shutdown()
    return result


def run_child(job: dict) -> dict:
    """Run one job in a fresh process; its result, or {"error": ...}."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", f.name], timeout=CHILD_TIMEOUT_S)
        data = json.loads(Path(f.name).read_text())
        if proc.returncode != 0 or "result" not in data:
            return {"error": f"child exited with code {proc.returncode}; see its log", "job": job["kind"]}
        return {**data["result"], "child_wall_s": time.perf_counter() - t0}
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {CHILD_TIMEOUT_S} s", "job": job["kind"]}
    finally:
        os.unlink(f.name)


def child_main(path: str) -> int:
    job = json.loads(Path(path).read_text())
    result = {"correctness": child_correctness, "throughput": child_throughput}[job["kind"]](job)
    Path(path).write_text(json.dumps({**job, "result": result}))
    return 0


# ---- the parent: plan, compare, write ------------------------------------------------------------


def compare(ref: dict, got: dict) -> dict:
    """TP=N against TP=1, prompt by prompt: identical, or diverging only at a near-tie of TP=1."""
    identical = explained = 0
    max_lp_err, first_div = 0.0, []
    for r, g in zip(ref["outputs"], got["outputs"]):
        n = next((i for i, (a, b) in enumerate(zip(r["token_ids"], g["token_ids"])) if a != b), None)
        for i in range(len(r["token_ids"]) if n is None else n):
            max_lp_err = max(max_lp_err, abs(r["top2"][i][0][1] - g["top2"][i][0][1]))
        if n is None:
            identical += 1
            continue
        top = r["top2"][n]
        margin = top[0][1] - top[1][1] if len(top) > 1 else float("inf")
        first_div.append({"position": n, "tp1_top2_margin": margin})
        explained += margin < FP32_TIE
    return {
        "prompts": len(ref["outputs"]),
        "identical": identical,
        "diverged_at_near_tie": explained,
        "divergences": first_div,
        "max_abs_logprob_diff_agreeing_prefix": max_lp_err,
    }


def gpu_count(smoke: bool) -> int:
    if smoke:
        return 2
    import torch

    return torch.cuda.device_count()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args.child)
    from pagoda.runtime.tools.bench import workloads
    from pagoda.runtime.tools.bench.results import environment

    smoke, gpus = args.smoke, gpu_count(args.smoke)
    device = "cpu" if smoke else "cuda"
    root = Path(tempfile.mkdtemp(prefix="pagoda-tp-"))
    common = dict(device=device, enforce_eager=args.enforce_eager)
    record = {"workload": "tensor_parallel", "backend": "pagoda", **environment(), "num_gpus": gpus,
              "command": " ".join(["python", "e2e/tp_gpu.py", *(argv if argv is not None else sys.argv[1:])])}  # fmt: skip
    ok = True

    if "correctness" in args.parts:
        model = str(
            model_dir(root, "correctness", {} if smoke else {"num_hidden_layers": CORRECTNESS_LAYERS}, smoke)
        )
        import random

        rng = random.Random(5)
        prompts = [[rng.randrange(10, 30000) for _ in range(rng.randint(4, 300))] for _ in range(NUM_PROMPTS)]
        tokens = 8 if smoke else NUM_TOKENS
        checks = []
        for dtype in ("float32", "bfloat16"):
            job = dict(kind="correctness", model=model, dtype=dtype, max_model_len=1024, prompts=prompts,
                       num_tokens=tokens, **common)  # fmt: skip
            ref = run_child({**job, "tp": 1})
            for tp in [s for s in args.sizes if s <= gpus]:
                got = run_child({**job, "tp": tp})
                if "error" in ref or "error" in got:
                    checks.append({"dtype": dtype, "tp": tp, "error": ref.get("error") or got.get("error")})
                    ok = False
                    continue
                check = {"dtype": dtype, "tp": tp, **compare(ref, got)}
                if dtype == "float32":
                    check["passed"] = check["identical"] + check["diverged_at_near_tie"] == check["prompts"]
                    ok &= check["passed"]
                checks.append(check)
                print(json.dumps(check))
        record["correctness"] = checks

    if "w1" in args.parts:
        model = str(workloads.model_folder("tiny" if smoke else "w1", root / "w1"))
        job = dict(kind="throughput", model=model, dtype="auto", max_model_len=2048,
                   num_prompts=8 if smoke else args.w1_prompts, output_len=8 if smoke else 256, **common)  # fmt: skip
        runs = {f"tp{tp}": run_child({**job, "tp": tp}) for tp in (1, 2) if tp <= gpus}
        w1 = {"runs": runs}
        if "output_tokens_per_s" in runs.get("tp1", {}) and "output_tokens_per_s" in runs.get("tp2", {}):
            w1["tp2_over_tp1"] = runs["tp2"]["output_tokens_per_s"] / runs["tp1"]["output_tokens_per_s"]
        record["w1"] = w1
        print(json.dumps(w1))

    if "big" in args.parts:
        shape = {"num_hidden_layers": 2} if smoke else LLAMA_3_1_70B
        model = str(model_dir(root, "llama-70b-shape", shape, smoke))
        job = dict(kind="throughput", model=model, dtype="auto", max_model_len=2048,
                   num_prompts=8 if smoke else args.big_prompts, output_len=16 if smoke else 256,
                   profile_steps=4 if smoke else args.profile_steps, **common)  # fmt: skip
        sizes = [2] if smoke else [s for s in args.big_sizes if s <= gpus]
        record["big"] = {"shape": "Llama-3.1-70B (random bf16 weights)", **shape,
                         "runs": [run_child({**job, "tp": tp}) for tp in sizes]}  # fmt: skip
        if not sizes:
            record["big"]["not_run"] = f"needs 4 or 8 GPUs; {gpus} visible"
        print(json.dumps(record["big"]))

    record["passed"] = ok
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}; passed={ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
