"""Tool calling over HTTP with the real `openai` SDK: tools reach the chat template; "required" and
a named function are forced by structured outputs, so their arguments always parse and match the
parameters; "auto" reads the model's own format with the hermes parser, streamed as tool-call
deltas that reassemble into the non-streamed call; --reasoning-parser fills reasoning_content."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

# pyproject's runtime extra installs xgrammar (CI has it); a venv built before it was added may not.
pytest.importorskip("xgrammar")
from server.live import MODEL, LiveServer
from transformers import AutoTokenizer

# Renders tools, as real templates do (Qwen2.5's puts them in the system turn).
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{% if message.get('tool_calls') %}{{ message['tool_calls'] | tojson }}{% endif %}"
    "{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,6}$"},
                          "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
CLOCK = {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": CLOCK}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": CLOCK}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
# What a Hermes-style model writes for a call; forced here by a regex, so a random model writes it.
HERMES_CALL = (r'Checking\.\n<tool_call>\n\{"name": "get_weather", "arguments": '
               r'\{"city": "[a-z]{1,6}", "unit": "celsius"\}\}\n</tool_call>')


@pytest.fixture(scope="module")
def server(tiny_llama):
    s = LiveServer(tiny_llama, max_model_len=1024, structured_outputs_disable_any_whitespace=True,
                   chat_template=TOOL_TEMPLATE,
                   server_config=dict(chat_template=TOOL_TEMPLATE, enable_auto_tool_choice=True,
                                      tool_call_parser="hermes", reasoning_parser="deepseek_r1"))
    yield s
    s.close()


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)


def test_tools_reach_the_chat_template(oai, tiny_llama):
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    want = tok.apply_chat_template(MESSAGES, tools=TOOLS, chat_template=TOOL_TEMPLATE, tokenize=False,
                                   add_generation_prompt=True)
    r = oai.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="none",
                                    max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens == len(tok(want, add_special_tokens=False).input_ids)
    assert "get_weather" in want
    assert r.choices[0].message.tool_calls in (None, [])


def _check_calls(calls):
    assert calls
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        assert call.id and call.type == "function"


def test_required_tool_choice_always_parses(oai):
    counts = set()
    for seed in range(6):
        parallel = seed % 2 == 0
        r = oai.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                        parallel_tool_calls=parallel, seed=seed, temperature=1.0, max_tokens=600)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.content is None
        _check_calls(c.message.tool_calls)
        assert parallel or len(c.message.tool_calls) == 1
        counts.add(len(c.message.tool_calls))
    assert max(counts) > 1  # parallel calls came too


def test_named_tool_choice_always_parses(oai):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    for seed in range(6):
        r = oai.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice=choice,
                                        seed=seed, temperature=1.0, max_tokens=100)
        c = r.choices[0]
        assert c.finish_reason == "stop"
        assert [t.function.name for t in c.message.tool_calls] == ["get_weather"]
        _check_calls(c.message.tool_calls)


def _stream_calls(oai, **kw):
    calls, content, finish = {}, "", None
    for chunk in oai.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, stream=True, **kw):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            entry["name"] += (tc.function.name or "") if tc.function else ""
            entry["arguments"] += (tc.function.arguments or "") if tc.function else ""
        finish = chunk.choices[0].finish_reason or finish
    return [calls[i] for i in sorted(calls)], content, finish


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_calls_stream_as_the_same_call(oai, tool_choice):
    kw = dict(tool_choice=tool_choice, seed=7, temperature=1.0, max_tokens=600)
    whole = oai.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, **kw).choices[0]
    calls, content, finish = _stream_calls(oai, **kw)
    assert calls == [{"name": t.function.name, "arguments": t.function.arguments} for t in whole.message.tool_calls]
    assert finish == whole.finish_reason and content == ""


def test_auto_tool_choice_parses_hermes_text_streamed_and_not(oai):
    kw = dict(tool_choice="auto", seed=3, temperature=1.0, max_tokens=200,
              extra_body={"structured_outputs": {"regex": HERMES_CALL}})
    whole = oai.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, **kw).choices[0]
    assert whole.finish_reason == "tool_calls"
    assert whole.message.content == "Checking.\n"
    _check_calls(whole.message.tool_calls)
    calls, content, finish = _stream_calls(oai, **kw)
    assert calls == [{"name": t.function.name, "arguments": t.function.arguments} for t in whole.message.tool_calls]
    assert content == whole.message.content and finish == "tool_calls"


def test_reasoning_content_streamed_and_not(oai):
    """deepseek_r1: the answer starts inside <think>; a random model never closes it, so all of its
    text is reasoning, none of it content."""
    kw = dict(model=MODEL, messages=MESSAGES, seed=5, temperature=1.0, max_tokens=12)
    whole = oai.chat.completions.create(**kw).choices[0].message
    reasoning = whole.model_extra["reasoning_content"]
    assert reasoning and not whole.content
    streamed = {"reasoning_content": "", "content": ""}
    for chunk in oai.chat.completions.create(stream=True, **kw):
        for key in streamed:
            streamed[key] += (chunk.choices[0].delta.model_extra or {}).get(key) or \
                getattr(chunk.choices[0].delta, key, None) or "" if chunk.choices else ""
    assert streamed == {"reasoning_content": reasoning, "content": ""}


def test_assistant_tool_calls_and_tool_results_render(oai):
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    r = oai.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, tool_choice="none", max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("kw, message", [
    (dict(tool_choice={"type": "function", "function": {"name": "nope"}}), "not in tools"),
    (dict(tool_choice="required", response_format={"type": "json_object"}), "cannot be combined"),
    (dict(tools=[{"type": "function", "function": {"name": "bad", "parameters": {"type": "nope"}}}],
          tool_choice="required"), 'Unsupported type "nope"'),
])
def test_bad_tool_requests_are_400s(oai, kw, message):
    kw = {"tools": TOOLS, **kw}
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, **kw)
    assert message in info.value.body["message"]


def test_auto_needs_the_server_flag(tiny_llama):
    s = LiveServer(tiny_llama, max_model_len=256)
    try:
        client = openai.OpenAI(base_url=s.v1, api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=5)
        assert "--enable-auto-tool-choice" in info.value.body["message"]
    finally:
        s.close()
