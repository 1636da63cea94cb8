"""Hermes / Qwen2.5 / Qwen3 tool calls: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block
per call, after any plain text."""

from __future__ import annotations

import json

from pagoda.runtime.frontend.tool_parsers import ParsedTools, ToolParser, call_from_json, held_back

START, END = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    name = "hermes"

    def parse(self, text: str, final: bool) -> ParsedTools:
        start = text.find(START)
        if start < 0:
            keep = len(text) if final else len(text) - held_back(text, START)
            return ParsedTools(text[:keep], [])
        calls, pos = [], start
        while pos >= 0:
            body_at = pos + len(START)
            end = text.find(END, body_at)
            if end < 0 and not final:
                break  # still being written
            body = text[body_at:] if end < 0 else text[body_at:end]
            try:
                call = call_from_json(json.loads(body))
            except ValueError:
                call = None
            if call is not None:
                calls.append(call)
            if end < 0:
                break
            pos = text.find(START, end + len(END))
        if final and not calls:
            return ParsedTools(text, [])  # no block parsed: the text stands, as vLLM returns it
        return ParsedTools(text[:start], calls)
