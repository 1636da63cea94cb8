"""/v1/embeddings with the real openai SDK against a pooling server, checked against transformers."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest
import torch
from server.live import MODEL, LiveServer

from .conftest import build_bare_model, make_inputs

TOL = 2e-5


@pytest.fixture(scope="module")
def mean_server(st_mean):
    # The engine in its own process, as `pagoda serve` runs it.
    s = LiveServer(st_mean, runner="auto", dtype="float32", max_model_len=64, engine_mode="process")
    yield s
    s.close()


@pytest.fixture(scope="module")
def matryoshka_server(tmp_path_factory):
    path = build_bare_model(tmp_path_factory.mktemp("matryoshka") / "llama", matryoshka_dimensions=[16, 32, 64])
    s = LiveServer(path, dtype="float32", max_model_len=64)
    yield s, str(path)
    s.close()


@pytest.fixture(scope="module")
def text_server(tiny_causal):
    s = LiveServer(tiny_causal, dtype="float32", max_model_len=64)
    yield s
    s.close()


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=60)


def tokens(path: str, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)(text).input_ids


def test_the_sdk_default_base64_and_floats_match_transformers(mean_server, st_mean, hf_embed):
    texts = ["def parse(text):", "import os", "a much longer input, which spans several KV blocks of the cache"]
    sdk = client(mean_server)
    default = sdk.embeddings.create(model=MODEL, input=texts)  # the SDK asks for base64 and decodes it
    floats = sdk.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    ids = [tokens(st_mean, t) for t in texts]
    assert default.usage.prompt_tokens == default.usage.total_tokens == sum(map(len, ids))
    assert default.model == MODEL and default.object == "list"
    for i, (a, b) in enumerate(zip(default.data, floats.data)):
        assert a.index == b.index == i and a.object == "embedding"
        expected = hf_embed.embed(st_mean, ids[i], "MEAN")
        assert torch.allclose(torch.tensor(a.embedding), expected, atol=TOL, rtol=0)
        assert np.array_equal(np.float32(a.embedding), np.float32(b.embedding))  # same float32 bits


def test_token_id_inputs_and_the_raw_base64_body(mean_server, st_mean, hf_embed):
    inputs = make_inputs([5, 40, 1], seed=11)
    sdk = client(mean_server)
    one = sdk.embeddings.create(model=MODEL, input=inputs[0], encoding_format="float")
    many = sdk.embeddings.create(model=MODEL, input=inputs, encoding_format="float")
    assert one.usage.prompt_tokens == 5 and many.usage.prompt_tokens == 46
    assert one.data[0].embedding == many.data[0].embedding
    body = httpx.post(f"{mean_server.v1}/embeddings", json={"input": inputs, "encoding_format": "base64",
                                                              "user": "ignored"}).json()
    for ids, item in zip(inputs, body["data"]):
        vector = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
        assert torch.allclose(torch.from_numpy(vector.copy()), hf_embed.embed(st_mean, ids, "MEAN"), atol=TOL, rtol=0)
    assert body["usage"]["completion_tokens"] == 0 and body["id"].startswith("embd-")


def test_normalize_and_truncation_fields(mean_server, st_mean, hf_embed):
    ids = make_inputs([30], seed=12)[0]
    raw = httpx.post(f"{mean_server.v1}/embeddings", json={"input": ids, "normalize": False}).json()
    assert torch.allclose(torch.tensor(raw["data"][0]["embedding"]),
                          hf_embed.embed(st_mean, ids, "MEAN", normalize=False), atol=TOL, rtol=0)
    cut = httpx.post(f"{mean_server.v1}/embeddings", json={"input": ids + ids + ids, "truncate_prompt_tokens": 20})
    assert cut.json()["usage"]["prompt_tokens"] == 20
    assert torch.allclose(torch.tensor(cut.json()["data"][0]["embedding"]),
                          hf_embed.embed(st_mean, (ids * 3)[-20:], "MEAN"), atol=TOL, rtol=0)


@pytest.mark.parametrize("body,param,message", [
    ({"input": ""}, "input", "empty string"),
    ({"input": []}, "input", "must not be empty"),
    ({"input": [[]]}, "input", "empty list of token ids"),
    ({"input": [["a"], 1]}, "input", ""),
    ({"input": list(range(5, 70))}, "input", "maximum context length is 64"),
    ({"input": [1, 10**6]}, "input", "out of range"),
    ({"input": "x", "dimensions": 8}, "dimensions", "does not support matryoshka"),
    ({"input": "x", "dimensions": 0}, "dimensions", ""),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format", ""),
    ({"input": "x", "truncate_prompt_tokens": 65}, "truncate_prompt_tokens", "greater than max_model_len"),
    ({"input": "x", "messages": [{"role": "user", "content": "x"}]}, "input", "exactly one of input or messages"),
    ({}, "input", "exactly one of input or messages"),
    ({"messages": []}, "messages", "must not be empty"),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ 1 }}"}, "chat_template",
     "--trust-request-chat-template"),
    ({"messages": [{"role": "user", "content": "x" * 30}] * 3}, "messages", "maximum context length is 64"),
    ({"input": "x", "embed_dtype": "float16"}, "embed_dtype", "not supported"),
    ({"input": "x", "endianness": "big"}, "endianness", "not supported"),
    ({"input": "x", "priority": 3}, "priority", "not supported"),
    ({"input": "x", "normalise": True}, "normalise", "not a field"),
    ({"input": "x", "temperature": 0.5}, "temperature", "not a field"),
])
def test_bad_input_is_a_400_in_openai_shape(mean_server, body, param, message):
    reply = httpx.post(f"{mean_server.v1}/embeddings", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert message in error["message"]


def test_unknown_fields_are_refused_through_the_sdk_and_harmless_defaults_pass(mean_server):
    """The SDK's extra_body reaches the schema: an unknown field is a 400 naming it (it used to be
    ignored), while vLLM's fields sent with the value that asks for nothing are accepted."""
    sdk = client(mean_server)
    with pytest.raises(openai.BadRequestError) as info:
        sdk.embeddings.create(model=MODEL, input="x", extra_body={"pooling_type": "CLS"})
    assert info.value.body["param"] == "pooling_type" and "not a field" in info.value.body["message"]
    harmless = {"embed_dtype": "float32", "endianness": "native", "priority": 0, "request_id": None}
    plain = sdk.embeddings.create(model=MODEL, input="x", encoding_format="float")
    assert sdk.embeddings.create(model=MODEL, input="x", encoding_format="float",
                                 extra_body=harmless).data[0].embedding == plain.data[0].embedding


def test_chat_style_messages_embed_their_rendered_conversation(mean_server, st_mean, hf_embed):
    """vLLM's chat embedding request: the conversation through the chat template (no generation
    prompt unless asked), tokenized without extra special tokens, then pooled as any input."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(st_mean)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def parse(text):"}]
    def reference(generation_prompt: bool) -> list[int]:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        return tok(text, add_special_tokens=False).input_ids

    def embed(**extra) -> dict:
        return httpx.post(f"{mean_server.v1}/embeddings",
                          json={"messages": messages, "encoding_format": "float", **extra}).json()

    for body, ids in ((embed(), reference(False)), (embed(add_generation_prompt=True), reference(True)),
                      (embed(truncate_prompt_tokens=5), reference(False)[-5:])):
        assert body["usage"]["prompt_tokens"] == len(ids)
        assert torch.allclose(torch.tensor(body["data"][0]["embedding"]), hf_embed.embed(st_mean, ids, "MEAN"),
                              atol=TOL, rtol=0)
    assert reference(True) != reference(False)


def test_the_sdk_sees_errors_as_its_exceptions(mean_server):
    sdk = client(mean_server)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        sdk.embeddings.create(model=MODEL, input=list(range(5, 70)))
    with pytest.raises(openai.NotFoundError):
        sdk.embeddings.create(model="another-model", input="x")
    with pytest.raises(openai.BadRequestError, match="does not support Chat Completions API"):
        sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="does not support Completions API"):
        sdk.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert mean_server.wait_idle()["kv_cache_usage"] == 0.0


def test_a_text_server_refuses_embeddings(text_server):
    with pytest.raises(openai.BadRequestError, match="does not support Embeddings API"):
        client(text_server).embeddings.create(model=MODEL, input="x")
    reply = client(text_server).completions.create(model=MODEL, prompt="x", max_tokens=2)
    assert reply.usage.completion_tokens == 2


def test_matryoshka_dimensions_truncate_then_normalize(matryoshka_server, hf_embed):
    server, path = matryoshka_server
    ids = make_inputs([12], seed=13)[0]
    reply = client(server).embeddings.create(model=MODEL, input=ids, dimensions=32)
    full = hf_embed.embed(path, ids, "LAST", normalize=False)
    expected = torch.nn.functional.normalize(full[:32], dim=-1)
    assert len(reply.data[0].embedding) == 32
    assert torch.allclose(torch.tensor(reply.data[0].embedding), expected, atol=TOL, rtol=0)
    with pytest.raises(openai.BadRequestError, match=r"only supports \[16, 32, 64\]"):
        client(server).embeddings.create(model=MODEL, input=ids, dimensions=20)


def metric(server, name: str, **labels) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{server.base_url}/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def test_metrics_count_prompt_tokens_and_no_generation(mean_server):
    before = {name: metric(mean_server, name) for name in
              ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:e2e_request_latency_seconds_count",
               "vllm:time_to_first_token_seconds_count")}
    success = metric(mean_server, "vllm:request_success_total", finished_reason="stop")
    reply = client(mean_server).embeddings.create(model=MODEL, input=make_inputs([7, 9], seed=14))
    mean_server.wait_idle()
    assert metric(mean_server, "vllm:prompt_tokens_total") == before["vllm:prompt_tokens_total"] + 16
    assert reply.usage.prompt_tokens == 16
    assert metric(mean_server, "vllm:generation_tokens_total") == before["vllm:generation_tokens_total"]
    assert metric(mean_server, "vllm:request_success_total", finished_reason="stop") == success + 2
    assert metric(mean_server, "vllm:e2e_request_latency_seconds_count") == \
        before["vllm:e2e_request_latency_seconds_count"] + 2
    assert metric(mean_server, "vllm:time_to_first_token_seconds_count") == \
        before["vllm:time_to_first_token_seconds_count"] + 2
    assert metric(mean_server, "vllm:num_requests_running") == 0
    from prometheus_client.parser import text_string_to_metric_families

    families = text_string_to_metric_families(httpx.get(f"{mean_server.base_url}/metrics").text)
    [info] = [s.labels for f in families if f.name == "vllm:cache_config_info" for s in f.samples]
    assert info["enable_prefix_caching"] == "False"  # MEAN pooling runs without it
