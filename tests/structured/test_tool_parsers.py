"""Tool-call and reasoning parsers on the text real models write, and their streaming contract:
fed the text in any chunks, the deltas add up to the non-streamed message."""

from __future__ import annotations

import json
import random

import pytest

from pagoda.runtime.frontend.reasoning import ReasoningParser
from pagoda.runtime.frontend.server.chat_output import MessageParser, StreamDiffer
from pagoda.runtime.frontend.tool_parsers import get_tool_parser

WEATHER = {"city": "Paris", "unit": "celsius"}

# (parser, model text, content, [(name, arguments)])
SAMPLES = [
    # Qwen2.5-7B-Instruct / Hermes-2-Pro: one <tool_call> block per call.
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
     "", [("get_weather", WEATHER)]),
    ("hermes", 'Let me check both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
               '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>',
     "Let me check both.\n", [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]),
    ("hermes", "No tools needed: 2 + 2 = 4.", "No tools needed: 2 + 2 = 4.", []),
    ("hermes", '<tool_call>\n{"name": "broken", "arguments": {', '<tool_call>\n{"name": "broken", "arguments": {', []),
    # Llama 3.1/3.2 JSON tool calling, with and without <|python_tag|>, several joined by ";".
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
     "", [("get_weather", WEATHER)]),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
                    '{"name": "get_time", "parameters": {"tz": "CET"}}',
     "", [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]),
    ("llama3_json", "The weather in Paris is mild.", "The weather in Paris is mild.", []),
    ("llama3_json", '{"not": "a call"}', '{"not": "a call"}', []),
    # Mistral: a JSON list after [TOOL_CALLS] (v3 tokenizers), or name[ARGS]{...} (v11+).
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]</s>',
     "", [("get_weather", WEATHER)]),
    ("mistral", 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}',
     "Sure.", [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]),
    ("mistral", "Plain answer.", "Plain answer.", []),
]


@pytest.mark.parametrize("name, text, content, calls", SAMPLES)
def test_parser_reads_model_text(name, text, content, calls):
    parsed = get_tool_parser(name).parse(text, final=True)
    assert parsed.content == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls


@pytest.mark.parametrize("name, text, content, calls", SAMPLES)
def test_streamed_deltas_add_up_to_the_message(name, text, content, calls):
    parser = MessageParser(tools=get_tool_parser(name))
    final = parser.parse(text, final=True)
    rng = random.Random(len(text))
    for _ in range(5):
        differ, got_content, got_calls, pos = StreamDiffer(parser), "", [], 0
        while pos < len(text):
            step = rng.randint(1, 6)
            delta = differ.delta(text[pos:pos + step], final=pos + step >= len(text))
            pos += step
            got_content += delta.get("content", "")
            got_calls += delta.get("tool_calls", [])
        assert got_content == final.content
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in got_calls] == \
            [(c.name, c.arguments) for c in final.calls]
        assert [c["index"] for c in got_calls] == list(range(len(got_calls)))


REASONING = [
    # DeepSeek-R1: the template opened <think>; the answer starts inside it.
    ("deepseek_r1", "The user greets me.\n</think>\n\nHello!", "The user greets me.\n", "Hello!"),
    ("deepseek_r1", "<think>Plan.</think>Answer.", "Plan.", "Answer."),
    ("deepseek_r1", "still thinking when max_tokens hit", "still thinking when max_tokens hit", ""),
    # Qwen3: <think> opens the answer when thinking is on; otherwise it is all content.
    ("qwen3", "<think>\nShort thought.\n</think>\n\nThe answer is 4.", "\nShort thought.\n", "The answer is 4."),
    ("qwen3", "The answer is 4.", None, "The answer is 4."),
]


@pytest.mark.parametrize("name, text, reasoning, content", REASONING)
def test_reasoning_parsers(name, text, reasoning, content):
    parser = MessageParser(reasoning=ReasoningParser(name))
    m = parser.parse(text, final=True)
    assert (m.reasoning, m.content) == (reasoning, content)
    differ, got = StreamDiffer(parser), {"reasoning_content": "", "content": ""}
    for i, ch in enumerate(text):
        for k, v in differ.delta(ch, final=i == len(text) - 1).items():
            got[k] += v
    assert got == {"reasoning_content": reasoning or "", "content": content}


def test_reasoning_then_tool_call():
    parser = MessageParser(reasoning=ReasoningParser("qwen3"), tools=get_tool_parser("hermes"))
    m = parser.parse('<think>Need the weather.</think>\n<tool_call>\n{"name": "get_weather", "arguments": '
                     '{"city": "Paris"}}\n</tool_call>', final=True)
    assert m.reasoning == "Need the weather." and m.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in m.calls] == [("get_weather", {"city": "Paris"})]


def test_named_function_arguments_stream_as_written():
    text = '{"city": "Paris", "unit": "celsius"}'
    parser = MessageParser(forced="get_weather")
    differ, deltas = StreamDiffer(parser), []
    for i, ch in enumerate(text):
        deltas += differ.delta(ch, final=i == len(text) - 1).get("tool_calls", [])
    assert deltas[0]["function"]["name"] == "get_weather" and deltas[0]["id"]
    assert len(deltas) == len(text)  # one argument fragment per chunk
    assert "".join(d["function"]["arguments"] for d in deltas) == text
    assert {d["index"] for d in deltas} == {0}
    (call,) = parser.parse(text, final=True).calls
    assert (call.name, call.arguments) == ("get_weather", text)


def test_unknown_parsers_are_refused():
    with pytest.raises(ValueError, match="hermes"):
        get_tool_parser("nope")
    with pytest.raises(ValueError, match="qwen3"):
        ReasoningParser("nope")
