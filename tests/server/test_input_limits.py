"""Limits that hold: a chunked body over the limit is cut off at the limit with a 413, and caps on
stop strings, logit_bias and batch size answer 400 naming the field. Each cap is the server's
own setting (RequestLimits), so the tests set small ones and check both sides of each."""

from __future__ import annotations

import httpx
import openai
import pytest

from pagoda.runtime.frontend.server.limits import RequestLimits

from .live import MODEL, LiveServer
from .test_errors import assert_error_shape

LIMITS = RequestLimits(max_body_bytes=256 << 10, max_stop_strings=3, max_stop_string_chars=8, max_logit_bias=2,
                       max_prompts=3)


@pytest.fixture(scope="module")
def limited(tiny_dir):
    s = LiveServer(tiny_dir, max_model_len=64, limits=LIMITS)
    yield s
    s.close()


def chunked(total: int, piece: int = 64 << 10):
    """A JSON body of `total` bytes, sent with chunked transfer encoding (no Content-Length)."""
    yield b'{"model": "tiny", "max_tokens": 2, "prompt": "'
    sent = 0
    while sent < total:
        yield b"a" * piece
        sent += piece
    yield b'"}'


def test_chunked_body_over_the_limit_is_413(limited):
    with httpx.Client(base_url=limited.base_url, timeout=60) as http:
        resp = http.post("/v1/completions", content=chunked(4 * LIMITS.max_body_bytes),
                         headers={"content-type": "application/json"})
        assert "content-length" not in resp.request.headers  # really chunked
        err = assert_error_shape(resp, 413)
        assert err["code"] == "request_too_large" and str(LIMITS.max_body_bytes) in err["message"]
    # Under the limit, the same framing is served.
    with httpx.Client(base_url=limited.base_url, timeout=60) as http:
        small = http.post("/v1/completions", content=chunked(16, piece=8),
                          headers={"content-type": "application/json"})
        assert small.status_code == 200, small.text
        assert http.get("/health").status_code == 200


def test_content_length_over_the_limit_is_413_before_the_body(limited):
    # The header alone decides: the body is never sent.
    with httpx.Client(base_url=limited.base_url, timeout=60) as http:
        body = b'{"prompt": "' + b"a" * LIMITS.max_body_bytes + b'"}'
        err = assert_error_shape(http.post("/v1/completions", content=body,
                                           headers={"content-type": "application/json"}), 413)
        assert err["code"] == "request_too_large"


@pytest.mark.parametrize(("extra", "param", "code"), [
    ({"stop": ["a", "b", "c", "d"]}, "stop", "too_many_stop_strings"),
    ({"stop": "123456789"}, "stop", "stop_string_too_long"),
    ({"stop": ["ok", "123456789"]}, "stop", "stop_string_too_long"),
    ({"logit_bias": {"1": 1.0, "2": 1.0, "3": 1.0}}, "logit_bias", "logit_bias_too_large"),
])
def test_sampling_caps_are_400_naming_the_field(limited, extra, param, code):
    oai = openai.OpenAI(base_url=limited.v1, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body=extra)
    assert (info.value.body["param"], info.value.body["code"]) == (param, code)
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                    extra_body=extra)
    assert (info.value.body["param"], info.value.body["code"]) == (param, code)


def test_caps_allow_what_they_allow(limited):
    oai = openai.OpenAI(base_url=limited.v1, api_key="x", max_retries=0)
    out = oai.completions.create(model=MODEL, prompt=["a", "b", "c"], max_tokens=2, stop=["x", "y", "12345678"])
    assert len(out.choices) == 3


@pytest.mark.parametrize("prompt", [["a"] * 4, [[5, 6]] * 4])
def test_too_many_prompts_in_a_batch_is_400(limited, prompt):
    oai = openai.OpenAI(base_url=limited.v1, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    assert (info.value.body["param"], info.value.body["code"]) == ("prompt", "too_many_prompts")
    # A flat list of token ids is one prompt, however long.
    assert oai.completions.create(model=MODEL, prompt=[5, 6, 7, 8, 9], max_tokens=2).choices


def test_default_caps_refuse_a_huge_stop_list(server):
    """The issue's case: 200,000 stop strings were accepted, and slowed every other request."""
    resp = httpx.post(server.v1 + "/completions", timeout=60,
                      json={"model": MODEL, "prompt": "hi", "max_tokens": 2, "stop": ["x"] * 200_000})
    assert assert_error_shape(resp, 400)["param"] == "stop"
