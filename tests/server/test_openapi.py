"""The OpenAPI document says what the server does: 400 (not FastAPI's 422) for bad input, a 200
schema for completions and chat, and numeric bounds the server really enforces. And every
validation error names its field in `param`."""

from __future__ import annotations

import httpx
import openai
import pytest

from .live import MODEL


@pytest.fixture(scope="module")
def spec(server) -> dict:
    return httpx.get(server.base_url + "/openapi.json").json()


def _resolve(spec: dict, schema: dict) -> dict:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def test_documented_statuses_are_the_served_ones(spec):
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            assert "422" not in op["responses"], (method, path)
            if method == "post":
                error = op["responses"]["400"]["content"]["application/json"]["schema"]
                assert _resolve(spec, error)["title"] == "ErrorResponse", path
    assert "HTTPValidationError" not in spec["components"]["schemas"]


@pytest.mark.parametrize(("path", "model"), [("/v1/completions", "CompletionResponse"),
                                             ("/v1/chat/completions", "ChatCompletionResponse")])
def test_completions_declare_their_200_schema(spec, path, model):
    ok = spec["paths"][path]["post"]["responses"]["200"]["content"]
    assert ok["application/json"]["schema"]["$ref"].endswith("/" + model)
    assert "text/event-stream" in ok


def _bounds(spec: dict, request_model: str):
    """(field, a value just outside its documented range, a value just inside) for each bound."""
    props = spec["components"]["schemas"][request_model]["properties"]
    for name, prop in props.items():
        options = prop.get("anyOf", [prop])
        numeric = [o for o in options if o.get("type") in ("integer", "number")]
        for o in numeric:
            step = 1 if o["type"] == "integer" else 1e-3
            # Bounds at the int32/int64 edges only keep values in range of the engine's types.
            o = {k: v for k, v in o.items() if not isinstance(v, int | float) or abs(v) < 1000}
            if "minimum" in o:
                yield name, o["minimum"] - step, o["minimum"]
            if "exclusiveMinimum" in o:
                yield name, o["exclusiveMinimum"], o["exclusiveMinimum"] + step
            if "maximum" in o:
                yield name, o["maximum"] + step, o["maximum"]


# A completion's max_tokens may be 0 only with echo (scoring the prompt).
VALID_WITH = {("CompletionRequest", "max_tokens"): {"echo": True}}


@pytest.mark.parametrize(("request_model", "route", "base"), [
    ("CompletionRequest", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2}),
    ("ChatCompletionRequest", "/v1/chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
])
def test_documented_bounds_are_the_enforced_ones(server, spec, request_model, route, base):
    checked = set()
    for name, outside, inside in _bounds(spec, request_model):
        checked.add(name)
        resp = httpx.post(server.base_url + route, json={**base, name: outside}, timeout=60)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == name, (name, outside, resp.text)
        if name in ("n", "best_of", "logprobs", "top_logprobs", "prompt_logprobs"):
            continue  # valid alone but tied to other fields (best_of == n, logprobs on chat); see above
        resp = httpx.post(server.base_url + route, json={**base, name: inside,
                                                          **VALID_WITH.get((request_model, name), {})}, timeout=60)
        assert resp.status_code == 200, (name, inside, resp.text)
    assert {"max_tokens", "temperature", "top_p", "presence_penalty", "min_p"} <= checked
    if request_model == "CompletionRequest":
        assert any(b[0] == "max_tokens" and b[2] == 0 for b in _bounds(spec, request_model))


@pytest.mark.parametrize(("bad", "param"), [
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": 0.0}, "top_p"),
    ({"n": 0}, "n"),
    ({"logprobs": 21}, "logprobs"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"presence_penalty": 3.0}, "presence_penalty"),
    ({"frequency_penalty": -3.0}, "frequency_penalty"),
    ({"min_p": 1.5}, "min_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
    ({"stop": [""]}, "stop"),
    ({"stop": ""}, "stop"),
    ({"top_k": -2}, "top_k"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"seed": "x"}, "seed"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, 2, 100000]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": None}, "prompt"),
    ({"logit_bias": {"5": 101.0}}, "logit_bias"),
])
def test_every_validation_error_names_its_field(server, bad, param):
    oai = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)
    kwargs = {"model": MODEL, "prompt": "hello", "max_tokens": 4}
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(**kwargs, extra_body=bad)
    assert info.value.body["param"] == param, info.value.body
