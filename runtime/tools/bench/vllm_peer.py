"""The vLLM peer: `pagoda bench throughput|latency --backend vllm` runs the same request lists through
vLLM's own `LLM` class in the same call as Pagoda, so that the ratio comes from one run (BENCHMARKS.md).

vLLM is not a dependency of Pagoda: it is imported only here, only when asked for. On the GPU
machine it comes from ../shared/tools/vllm-peer; run the bench with vLLM's packages first on the
path and without Pagoda's serving wheels (vLLM pins its own FastAPI and pydantic):
    PYTHONPATH=/tmp/vsite:/tmp/pagoda-src HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \\
        python3 -m pagoda.runtime.cli bench throughput --workload W4 --backend vllm
The bench modules import only the standard library before a runner starts, so Pagoda's side of
that command needs nothing from /tmp/site.
"""

from __future__ import annotations

import time

# Engine knobs that mean the same in both engines, under the same name. A knob left at None keeps
# vLLM's own default (its seat count and step token budget are its to choose unless the run sets
# them), so a ratio to vLLM "as shipped" needs no flag and one "at the same seats" needs one.
SHARED_KNOBS = ("dtype", "max_model_len", "block_size", "gpu_memory_utilization", "max_num_seqs",
                "max_num_batched_tokens", "long_prefill_token_threshold", "enable_prefix_caching", "seed", "load_format",
                "enforce_eager", "quantization", "kv_cache_dtype")


def import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise SystemExit(f"--backend vllm needs vLLM importable ({e}); on the GPU machine install "
                         "../shared/tools/vllm-peer and put its site folder first on PYTHONPATH "
                         "(runtime/tools/bench/vllm_peer.py says how)") from None
    return vllm


def vllm_kwargs(args, model_path) -> dict:
    kwargs = {"model": str(model_path)}
    for name in SHARED_KNOBS:
        value = getattr(args, name, None)
        if value is not None:
            kwargs[name] = value
    return kwargs


def make_llm(args, model_path):
    vllm = import_vllm()
    return vllm, vllm.LLM(**vllm_kwargs(args, model_path))


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_throughput(args, model_path, requests, warm, json_schema: str | None = None) -> dict:
    """W1/W4/W5 on vLLM: the warm-up requests first (another draw, as Pagoda's side), then the
    timed generation of the whole list with greedy sampling and EOS ignored; with json_schema,
    every request follows it through vLLM's structured outputs (compact JSON, as Pagoda's side)."""
    vllm, llm = make_llm(args, model_path)
    from vllm.inputs import TokensPrompt

    structured = None
    if json_schema is not None:
        from vllm.sampling_params import StructuredOutputsParams

        structured = StructuredOutputsParams(json=json_schema, disable_any_whitespace=True)

    def sampling(max_tokens: int):
        return vllm.SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                                   structured_outputs=structured)

    if warm:
        llm.generate([TokensPrompt(prompt_token_ids=r.prompt_token_ids) for r in warm],
                     sampling(args.warmup_tokens), use_tqdm=False)
    _sync()
    prompts = [TokensPrompt(prompt_token_ids=r.prompt_token_ids) for r in requests]
    params = sampling(args.output_len)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    _sync()
    elapsed = time.perf_counter() - start
    return {"elapsed_s": elapsed, "output_tokens": sum(len(c.token_ids) for o in outputs for c in o.outputs),
            "vllm": vllm.__version__, "vllm_kwargs": vllm_kwargs(args, model_path),
            "vllm_max_num_seqs": _max_num_seqs(llm)}


def _max_num_seqs(llm) -> int | None:
    """The seat count vLLM chose (its default depends on the GPU), for the record."""
    config = getattr(llm.llm_engine, "vllm_config", None)
    return getattr(getattr(config, "scheduler_config", None), "max_num_seqs", None)


def run_latency(args, model_path, prompt) -> list[tuple[float, list[float]]]:
    """W2 on vLLM: one request alone, stepping vLLM's engine as Pagoda's side steps its own, and
    stamping each new token as the step that made it returns to the host."""
    vllm, llm = make_llm(args, model_path)
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    params = vllm.SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    runs = []
    for i in range(args.warmup_iters + args.iters):
        request_id = f"w2-{i}"
        stamps: list[float] = []
        start = time.perf_counter()
        engine.add_request(request_id, TokensPrompt(prompt_token_ids=prompt), params)
        while engine.has_unfinished_requests():
            outputs = engine.step()
            now = time.perf_counter()
            for out in outputs:
                if out.request_id == request_id:
                    stamps += [now] * (len(out.outputs[0].token_ids) - len(stamps))
        runs.append((start, stamps))
    return runs[args.warmup_iters:]
