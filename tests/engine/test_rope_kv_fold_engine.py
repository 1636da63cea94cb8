"""--fold-rope-kv through the whole engine: a tiny bf16 Llama generating greedily, with every kernel
the GPU would run (Triton, interpreted: the dispatcher takes CPU tensors for CUDA ones) and the
one-row qkv GEMV measured for its shape, gives the same tokens and logprobs with the fold as without
it, and the fold's kernel ran at each decode step. test_rope_kv_fold_path.py holds the block to the
same bits; this holds the engine's use of it (the slot it writes, the positions, the steps after)."""

import pytest
import torch

from pagoda.kernels import gemv as gemv_module
from pagoda.kernels import gemv_rope as rope_module
from pagoda.kernels import ops
from pagoda.kernels.gemv import GemvConfig
from pagoda.runtime.frontend.llm import LLM
from pagoda.runtime.sampling_params import SamplingParams
from pagoda.runtime.tools.tiny_models import build_tiny_model

HIDDEN, QKV = 64, (4 + 2 * 2) * 16  # the tiny Llama: 4 heads, 2 KV heads, head_dim 16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("rope-fold") / "llama", "llama"))


def generate(model: str, fold: bool, monkeypatch) -> tuple[list, list, int]:
    calls = []
    fold_kernel = rope_module.gemv_rope_kv
    monkeypatch.setattr(rope_module, "gemv_rope_kv", lambda *a, **kw: calls.append(1) or fold_kernel(*a, **kw))
    llm = LLM(model, dtype="bfloat16", device="cpu", max_model_len=128, num_kv_blocks=32, fold_rope_kv=fold)
    try:
        assert ops.FOLD_ROPE_KV is fold  # installed when the runner started
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)
        (out,) = llm.generate(["def rotate(self, x):"], params, use_tqdm=False)
    finally:
        llm.shutdown()
        ops.configure(device=torch.device("cpu"))
    completion = out.outputs[0]
    return completion.token_ids, [lp[t].logprob for lp, t in zip(completion.logprobs, completion.token_ids)], len(calls)


def test_greedy_tokens_and_logprobs_are_the_same_with_the_fold(tiny, monkeypatch):
    monkeypatch.setattr(ops, "_on_gpu", lambda t: True)
    monkeypatch.setattr(gemv_module, "FASTER_THAN_CUBLAS", {
        (1, QKV, HIDDEN, None): GemvConfig(block_n=4, block_k=32, split_k=1, num_warps=4, fold=8)})
    off_tokens, off_logprobs, off_calls = generate(tiny, False, monkeypatch)
    on_tokens, on_logprobs, on_calls = generate(tiny, True, monkeypatch)
    assert off_calls == 0 and on_calls == 2 * 5  # two layers, at each of the 5 decode steps (not the prefill)
    assert on_tokens == off_tokens and len(on_tokens) == 6
    assert on_logprobs == off_logprobs
