"""Tool-call parsers: the model's own tool-call text -> OpenAI `tool_calls` (vLLM's
--tool-call-parser names).

Each parser turns the text generated so far into (content, calls). With final=False it answers
only what can no longer change as more text arrives: content that cannot be the start of a
tool-call marker, and calls whose text is complete. So a stream sends exactly the differences
between successive answers, and the streamed deltas add up to the non-streamed message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(slots=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it


@dataclass(slots=True)
class ParsedTools:
    content: str
    calls: list[ParsedCall]


class ToolParser:
    name = ""
    keep_special_tokens = False  # its markers are special tokens, which detokenization would drop

    def parse(self, text: str, final: bool) -> ParsedTools:
        raise NotImplementedError


def held_back(text: str, marker: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of marker."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def call_from_json(obj) -> ParsedCall | None:
    """{"name": ..., "arguments" | "parameters": {...}} -> a call, or None when it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


def decode_objects(text: str, separators: str = ",; \n\t") -> tuple[list, int]:
    """Consecutive JSON values at the start of text (after whitespace), separated by any of
    `separators`; returns them and where parsing stopped."""
    decoder, values, pos = json.JSONDecoder(), [], 0
    while True:
        while pos < len(text) and text[pos] in separators:
            pos += 1
        if pos >= len(text):
            return values, pos
        try:
            value, end = decoder.raw_decode(text, pos)
        except ValueError:
            return values, pos
        values.append(value)
        pos = end


def get_tool_parser(name: str) -> ToolParser:
    from pagoda.runtime.frontend.tool_parsers.hermes import HermesToolParser
    from pagoda.runtime.frontend.tool_parsers.llama3_json import Llama3JsonToolParser
    from pagoda.runtime.frontend.tool_parsers.mistral import MistralToolParser

    parsers = {p.name: p for p in (HermesToolParser, Llama3JsonToolParser, MistralToolParser)}
    if name not in parsers:
        raise ValueError(f"unknown tool call parser {name!r}; choose one of {', '.join(sorted(parsers))}")
    return parsers[name]()


TOOL_PARSERS = ("hermes", "llama3_json", "mistral")
