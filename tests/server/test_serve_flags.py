"""`pagoda serve` with vLLM's flags, run as a user runs it: `--dtype half`, several `--api-key`s, and
generation_config.json's sampling defaults, which a request's own values override."""

from __future__ import annotations

import json
import shutil

import openai
import pytest
import torch
from serve_process import pagoda_serve

from pagoda.runtime import LLM, SamplingParams

from .live import LiveServer


def test_dtype_half_and_several_api_keys(tiny_dir, tmp_path):
    flags = ("--dtype", "half", "--device", "cpu", "--max-model-len", "64", "--api-key", "k1", "k2",
             "--served-model-name", "tiny")
    with pagoda_serve(tiny_dir, *flags, log_path=tmp_path / "serve.log") as server:
        for key in ("k1", "k2"):
            client = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)
            got = client.completions.create(model="tiny", prompt="hello there", max_tokens=6, temperature=0)
            assert got.usage.completion_tokens == 6
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="k3", max_retries=0).models.list()
    # The same greedy tokens as an in-process float16 engine: the flag reached the weights.
    with LLM(tiny_dir, dtype="half", device="cpu", max_model_len=64) as llm:
        assert next(llm.llm_engine.runner.model.parameters()).dtype == torch.float16
        ids = llm.get_tokenizer().encode("hello there")
        want = llm.generate([ids], SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)[0]
    assert got.choices[0].text == want.outputs[0].text


@pytest.fixture(scope="module")
def gen_config_model(tiny_dir, tmp_path_factory):
    """The tiny model with sampling defaults: greedy, and 3 new tokens unless asked otherwise."""
    path = tmp_path_factory.mktemp("genconfig") / "tiny"
    shutil.copytree(tiny_dir, path)
    gen = path / "generation_config.json"
    config = json.loads(gen.read_text()) if gen.exists() else {}
    gen.write_text(json.dumps({**config, "temperature": 0.0, "max_new_tokens": 3}))
    return str(path)


def test_generation_config_defaults_apply_unless_the_request_overrides(gen_config_model, hf_tiny):
    prompt = [5, 9, 23, 42, 77]
    greedy = hf_tiny.greedy(prompt, 8)
    with LLM(gen_config_model, device="cpu", max_model_len=64) as llm:
        default = llm.get_default_sampling_params()
        assert (default.temperature, default.max_tokens) == (0.0, 3)
        (out,) = llm.generate([prompt], use_tqdm=False)  # no sampling_params: the model's defaults
        assert out.outputs[0].token_ids == greedy[:3]
    s = LiveServer(gen_config_model, max_model_len=64)
    try:
        client = openai.OpenAI(base_url=s.v1, api_key="x", max_retries=0)
        chat = [{"role": "user", "content": "hi"}]
        go = {"ignore_eos": True}
        a, b = (client.chat.completions.create(model="tiny", messages=chat, extra_body=go) for _ in range(2))
        assert a.usage.completion_tokens == 3 and a.choices[0].finish_reason == "length"
        assert a.choices[0].message.content == b.choices[0].message.content  # greedy by default
        longer = client.chat.completions.create(model="tiny", messages=chat, max_tokens=5, extra_body=go)
        assert longer.usage.completion_tokens == 5
        # The request's own temperature wins: sampled, several seeds cannot all give the greedy text.
        sampled = {client.chat.completions.create(model="tiny", messages=chat, max_tokens=5, temperature=1.5,
                                                  seed=seed, extra_body=go).choices[0].message.content
                   for seed in range(4)}
        assert sampled != {longer.choices[0].message.content}
    finally:
        s.close()
    s = LiveServer(gen_config_model, max_model_len=64, generation_config="vllm")
    try:
        client = openai.OpenAI(base_url=s.v1, api_key="x", max_retries=0)
        out = client.completions.create(model="tiny", prompt=prompt, max_tokens=None, temperature=0,
                                        extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 64 - len(prompt)  # no max_new_tokens default any more
    finally:
        s.close()
