"""Llama 3.x JSON tool calls: the whole answer is {"name": ..., "parameters": {...}} (optionally after
<|python_tag|>), several separated by ";". Anything else is plain content."""

from __future__ import annotations

from pagoda.runtime.frontend.tool_parsers import ParsedTools, ToolParser, call_from_json, decode_objects

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"

    def parse(self, text: str, final: bool) -> ParsedTools:
        body = text.lstrip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG):].lstrip()
        elif not body or (PYTHON_TAG.startswith(body) and not final):
            return ParsedTools("", [])  # cannot tell yet
        if not body.startswith("{"):
            return ParsedTools(text, [])
        values, _ = decode_objects(body, separators="; \n\t")
        calls = [c for c in map(call_from_json, values) if c is not None]
        if final and not calls:
            return ParsedTools(text, [])  # it looked like a call but is not one: the text stands
        return ParsedTools("", calls)
