"""Structured outputs over HTTP with the real `openai` SDK: response_format json_schema (and the
SDK's `.parse()`), json_object, and vLLM's structured_outputs field, streamed and not; a bad
grammar is a 400 naming the field, and the legacy guided_* fields are refused."""

from __future__ import annotations

import json
import re
from typing import Literal

import jsonschema
import openai
import pytest

# pyproject's runtime extra installs xgrammar (CI has it); a venv built before it was added may not.
pytest.importorskip("xgrammar")
from pydantic import BaseModel, Field
from server.live import MODEL, LiveServer

from .conftest import CHOICES, PERSON, REGEX

SEEDS = range(8)


class Person(BaseModel):
    name: str = Field(pattern=r"^[a-z]{1,8}$")
    age: int = Field(ge=0, le=120)
    role: Literal["dev", "ops", "qa"]
    tags: list[Literal["x", "y"]] = Field(max_length=3)


@pytest.fixture(scope="module")
def server(tiny_llama):
    # The engine in its own process: the TokenizerInfo crosses to it as a command.
    s = LiveServer(tiny_llama, max_model_len=512, engine_mode="process",
                   structured_outputs_disable_any_whitespace=True)
    yield s
    s.close()


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)


MESSAGES = [{"role": "user", "content": "Who is on call?"}]


def test_sdk_parse_returns_the_model_over_seeds(oai):
    for seed in SEEDS:
        r = oai.chat.completions.parse(model=MODEL, messages=MESSAGES, response_format=Person, seed=seed,
                                       temperature=1.0, max_completion_tokens=150)
        choice = r.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Person)
        jsonschema.validate(json.loads(choice.message.content), Person.model_json_schema())


def test_response_format_json_schema_streamed(oai):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for seed in range(4):
        chunks = list(oai.chat.completions.create(model=MODEL, messages=MESSAGES, response_format=fmt, seed=seed,
                                                  temperature=1.0, max_tokens=150, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(text), PERSON)


def test_response_format_json_object(oai):
    for seed in range(3):
        r = oai.chat.completions.create(model=MODEL, messages=MESSAGES, response_format={"type": "json_object"},
                                        seed=seed, temperature=1.0, max_tokens=400)
        c = r.choices[0]
        assert c.finish_reason == "stop", c.message.content
        assert isinstance(json.loads(c.message.content), dict)


def test_structured_outputs_field_on_both_endpoints(oai):
    for seed in SEEDS:
        r = oai.completions.create(model=MODEL, prompt="code:", seed=seed, temperature=1.0, max_tokens=40,
                                   extra_body={"structured_outputs": {"regex": REGEX}})
        assert re.fullmatch(REGEX, r.choices[0].text), r.choices[0].text
        c = oai.chat.completions.create(model=MODEL, messages=MESSAGES, seed=seed, temperature=1.0, max_tokens=40,
                                        extra_body={"structured_outputs": {"choice": CHOICES}})
        assert c.choices[0].message.content in CHOICES


def test_structured_outputs_n_and_stream(oai):
    stream = oai.completions.create(model=MODEL, prompt="x", n=3, seed=1, temperature=1.0, max_tokens=40,
                                    stream=True, extra_body={"structured_outputs": {"regex": REGEX}})
    texts = {}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert sorted(texts) == [0, 1, 2]
    assert all(re.fullmatch(REGEX, t) for t in texts.values()), texts


@pytest.mark.parametrize("body, param, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format", 'response_format.json_schema.schema: invalid json: Unsupported type "nope"'),
    ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs", "parenthesis is not closed"),
    ({"structured_outputs": {"grammar": "root ::= foo"}}, "structured_outputs", 'Rule "foo" is not defined'),
    ({"structured_outputs": {"json": {"type": "object"}, "regex": "a"}}, "structured_outputs", "exactly one"),
    ({"guided_json": {"type": "object"}}, "guided_json", "use structured_outputs"),
    ({"guided_choice": ["a", "b"]}, "guided_choice", "use structured_outputs"),
])
def test_bad_grammars_and_legacy_fields_are_400s(oai, server, body, param, message):
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, extra_body=body)
    err = info.value.body
    assert info.value.status_code == 400 and err["param"] == param
    assert message in err["message"]
    server.wait_idle()
    ok = oai.completions.create(model=MODEL, prompt="x", max_tokens=20, temperature=0,
                                extra_body={"structured_outputs": {"choice": ["fine"]}})
    assert ok.choices[0].text == "fine"


def test_unknown_structured_outputs_key_is_a_400(oai):
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(model=MODEL, prompt="x", max_tokens=5,
                               extra_body={"structured_outputs": {"jsn": {}}})
    assert "structured_outputs" in info.value.body["message"]
