"""The CUDA-graph side of the model runner that runs on the CPU: bucket sizes, padding of decode
batches to them, and --enforce-eager. Capture and replay themselves need a GPU
(e2e/gpu_correctness.py checks them there); everything that decides what they run is here."""

from __future__ import annotations

import pytest

from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.worker.cuda_graphs import DecodeGraphs, capture_sizes, padded_size

from .conftest import make_prompts


def test_capture_sizes():
    # Past 512 rows the buckets widen to 16, up to max_num_seqs itself.
    wide = capture_sizes(1024)
    assert wide[: len(capture_sizes(512))] == capture_sizes(512) and wide[-1] == 1024
    assert wide[len(capture_sizes(512)):] == list(range(528, 1025, 16))
    assert capture_sizes(530)[-2:] == [528, 530]
    assert capture_sizes(1) == [1]
    assert capture_sizes(5) == [1, 2, 4, 5]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    sizes = capture_sizes(256)
    assert sizes[:6] == [1, 2, 4, 8, 16, 24] and sizes[-1] == 256
    assert all(b - a == 8 for a, b in zip(sizes[3:], sizes[4:]))


@pytest.mark.parametrize(
    "num_seqs, want", [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 16), (17, 24), (255, 256), (256, 256)]
)
def test_padded_size_is_the_smallest_bucket_that_fits(num_seqs, want):
    assert padded_size(num_seqs, capture_sizes(256)) == want


def test_padded_size_beyond_the_largest_bucket():
    assert padded_size(9, capture_sizes(8)) is None
    assert padded_size(3, []) is None  # enforce_eager: nothing is padded


def test_enforce_eager_is_an_engine_arg():
    assert EngineArgs(model="m").enforce_eager is False
    assert EngineArgs(model="m", enforce_eager=True).enforce_eager is True


def _record_runs(monkeypatch) -> list[int]:
    sizes: list[int] = []
    real_run = DecodeGraphs.run

    def run(self, size):
        sizes.append(size)
        return real_run(self, size)

    monkeypatch.setattr(DecodeGraphs, "run", run)
    return sizes


def test_decode_steps_take_the_padded_graph_path(tiny_models, hf, monkeypatch):
    path = tiny_models["llama"]
    prompts = make_prompts(lengths=[3, 9, 17, 5, 1])
    sizes = _record_runs(monkeypatch)
    llm = LLM(path, block_size=8, max_model_len=64, device="cpu", max_num_seqs=8)
    runner = llm.llm_engine.runner
    assert runner.graph_sizes == [1, 2, 4, 8] and runner.graphs is not None
    outs = llm.generate(
        prompt_token_ids=prompts, sampling_params=SamplingParams(temperature=0, max_tokens=6), use_tqdm=False
    )
    # 5 live sequences pad to the bucket of 8; the steps after the prefill are all decodes.
    assert sizes and set(sizes) == {8}
    assert len(sizes) == 5
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == hf.greedy(path, p, max_new_tokens=6)


def test_enforce_eager_turns_graphs_and_padding_off(tiny_models, hf, monkeypatch):
    path = tiny_models["qwen2"]
    prompts = make_prompts(lengths=[4, 12, 7])
    sizes = _record_runs(monkeypatch)
    llm = LLM(path, block_size=8, max_model_len=64, device="cpu", max_num_seqs=8, enforce_eager=True)
    runner = llm.llm_engine.runner
    assert runner.graph_sizes == [] and runner.graphs is None
    outs = llm.generate(
        prompt_token_ids=prompts, sampling_params=SamplingParams(temperature=0, max_tokens=5), use_tqdm=False
    )
    assert sizes == []
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == hf.greedy(path, p, max_new_tokens=5)
