"""`pagoda bench throughput --backend vllm` on the CPU. vLLM itself is not installed here, so the
runner is driven through a `vllm` module whose LLM, SamplingParams and TokensPrompt are Pagoda's
own vLLM-compatible ones: what is checked is that the peer's runner speaks vLLM's offline API (the
keyword names, TokensPrompt, greedy with ignore_eos) and that its figure counts every token."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import fields

import pytest

from pagoda.runtime.cli import main
from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.tools.bench import vllm_peer


@pytest.fixture(autouse=True)
def bench_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGODA_BENCH_CACHE", str(tmp_path / "models"))


def _vllm_through_pagoda(monkeypatch):
    from pagoda.runtime.frontend.llm import LLM
    from pagoda.runtime.sampling_params import SamplingParams

    made = []

    class RecordingLLM(LLM):
        def __init__(self, **kwargs):
            made.append(kwargs)
            super().__init__(**kwargs)

    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams, module.__version__ = RecordingLLM, SamplingParams, "pagoda-shim"
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict  # vLLM's TokensPrompt is a TypedDict: a plain dict at run time
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    return made


def test_throughput_through_vllm_api(tmp_path, monkeypatch):
    made = _vllm_through_pagoda(monkeypatch)
    out = tmp_path / "results"
    assert main(["bench", "throughput", "--backend", "vllm", "--model", "tiny", "--num-prompts", "3",
                 "--output-len", "4", "--warmup-prompts", "2", "--warmup-tokens", "2", "--max-model-len", "1100",
                 "--max-num-seqs", "8", "--out", str(out)]) == 0
    (path,) = out.glob("W1-vllm-*.json")
    record = json.loads(path.read_text())
    assert record["backend"] == "vllm" and record["vllm"] == "pagoda-shim"
    assert record["output_tokens"] == 3 * 4
    # The knobs the run set reach vLLM under their shared names; those left unset keep vLLM's default.
    (kwargs,) = made
    assert kwargs["max_num_seqs"] == 8 and kwargs["max_model_len"] == 1100 and kwargs["load_format"] == "dummy"
    assert "max_num_batched_tokens" not in kwargs and record["vllm_kwargs"] == kwargs


def test_shared_knobs_are_engine_knobs():
    # A knob renamed on Pagoda's side would silently stop reaching vLLM.
    assert set(vllm_peer.SHARED_KNOBS) <= {f.name for f in fields(EngineArgs)}


def test_without_vllm_the_error_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    with pytest.raises(SystemExit, match="vllm-peer"):
        main(["bench", "latency", "--backend", "vllm", "--model", "tiny", "--out", str(tmp_path)])
