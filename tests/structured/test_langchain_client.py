"""LangChain's OpenAI chat model against `pagoda serve`, as the issue's new user tried it:
`with_structured_output` in its three methods (json_schema, function_calling, json_mode) and
`bind_tools` with a forced and a required tool choice, streamed and not. LangChain builds the
requests (its own schema conversion, strict flags, tool_choice shapes) and parses the replies, so
these fail on any field the server refuses or any reply shape the client cannot read."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pytest

pytest.importorskip("xgrammar")  # the runtime extra installs it (CI has it)
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field
from server.live import MODEL, LiveServer

# Renders tools into the prompt, as real templates do (the tiny model's own template has none).
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SEEDS = range(4)


class Person(BaseModel):
    """Who is on call (bounded on every axis, so a random model always reaches the end)."""

    name: str = Field(pattern=r"^[a-z]{1,8}$")
    age: int = Field(ge=0, le=120)
    role: Literal["dev", "ops", "qa"]


class WeatherArgs(BaseModel):
    city: str = Field(pattern=r"^[a-z]{1,6}$")
    unit: Literal["celsius", "fahrenheit"]


class TimeArgs(BaseModel):
    tz: Literal["UTC", "CET"]


@tool("get_weather", args_schema=WeatherArgs)
def get_weather(city: str, unit: str) -> str:
    """The weather in a city now."""
    return f"sunny in {city}"


@tool("get_time", args_schema=TimeArgs)
def get_time(tz: str) -> str:
    """The time in a time zone."""
    return "noon"


@pytest.fixture(scope="module")
def server(tiny_llama):
    s = LiveServer(tiny_llama, max_model_len=1024, structured_outputs_disable_any_whitespace=True,
                   server_config=dict(chat_template=TOOL_TEMPLATE))
    yield s
    s.close()


def chat(server, seed: int, **kwargs) -> ChatOpenAI:
    settings = dict(temperature=1.0, max_tokens=200) | kwargs
    return ChatOpenAI(model=MODEL, base_url=server.v1, api_key="unused", max_retries=0, seed=seed, **settings)


def test_with_structured_output_json_schema(server):
    for seed in SEEDS:
        out = chat(server, seed).with_structured_output(Person, method="json_schema", strict=True,
                                                        include_raw=True).invoke("Who is on call?")
        assert out["parsing_error"] is None, out["raw"].content
        assert isinstance(out["parsed"], Person)
        jsonschema.validate(json.loads(out["raw"].content), Person.model_json_schema())


def test_with_structured_output_function_calling(server):
    # LangChain sends Person as a tool and forces it with a named tool_choice.
    for seed in SEEDS:
        out = chat(server, seed).with_structured_output(Person, method="function_calling",
                                                        include_raw=True).invoke("Who is on call?")
        assert out["parsing_error"] is None, out["raw"]
        assert isinstance(out["parsed"], Person)
        assert [c["name"] for c in out["raw"].tool_calls] == ["Person"]


def test_with_structured_output_json_mode(server):
    # json_mode is response_format json_object: any JSON object, which LangChain parses to a dict.
    for seed in range(2):
        out = chat(server, seed, max_completion_tokens=400).with_structured_output(
            method="json_mode", include_raw=True).invoke("Reply in JSON.")
        assert out["parsing_error"] is None, out["raw"].content
        assert isinstance(out["parsed"], dict)


@pytest.mark.parametrize("tool_choice", ["get_weather", "required", "any"])
def test_bind_tools_forced_calls_parse(server, tool_choice):
    schemas = {"get_weather": WeatherArgs.model_json_schema(), "get_time": TimeArgs.model_json_schema()}
    for seed in SEEDS:
        # "required" is an array of one or more calls: a random model may write many (600 tokens)
        llm = chat(server, seed, max_tokens=600).bind_tools([get_weather, get_time], tool_choice=tool_choice)
        msg = llm.invoke("Weather in Paris?")
        assert isinstance(msg, AIMessage) and msg.tool_calls, msg
        assert not msg.invalid_tool_calls, msg.invalid_tool_calls
        for call in msg.tool_calls:
            if tool_choice == "get_weather":
                assert call["name"] == "get_weather"
            jsonschema.validate(call["args"], schemas[call["name"]])
        # As OpenAI answers: "tool_calls" when the model chose the call, "stop" for a named function.
        want = "stop" if tool_choice == "get_weather" else "tool_calls"
        assert msg.response_metadata["finish_reason"] == want


def test_bind_tools_stream_reassembles_into_the_call(server):
    llm = chat(server, 3, temperature=0.0).bind_tools([get_weather], tool_choice="get_weather")
    whole = llm.invoke("Weather in Paris?")
    chunks = list(llm.stream("Weather in Paris?"))
    assert len(chunks) > 2  # the arguments arrive in pieces
    summed = chunks[0]
    for c in chunks[1:]:
        summed = summed + c
    assert isinstance(summed, AIMessageChunk)
    assert [(c["name"], c["args"]) for c in summed.tool_calls] == [(c["name"], c["args"]) for c in whole.tool_calls]


def test_bind_tools_auto_without_a_parser_is_a_400(server):
    # bind_tools without a tool_choice means "auto"; this server runs without
    # --enable-auto-tool-choice, so it answers as vLLM does: a 400 that says which flag is missing.
    with pytest.raises(openai.BadRequestError, match="--enable-auto-tool-choice"):
        chat(server, 0, max_tokens=8).bind_tools([get_weather]).invoke("Hi")
    assert chat(server, 0, max_tokens=4).invoke("Hi").response_metadata["finish_reason"] == "length"
