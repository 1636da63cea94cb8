"""Mistral tool calls, after the [TOOL_CALLS] token: a JSON list of {"name", "arguments"} (tokenizer
v3-v7), or name[ARGS]{...} per call (v11 and later)."""

from __future__ import annotations

import json

from pagoda.runtime.frontend.tool_parsers import (
    ParsedCall,
    ParsedTools,
    ToolParser,
    call_from_json,
    decode_objects,
    held_back,
)

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"


class MistralToolParser(ToolParser):
    name = "mistral"
    keep_special_tokens = True  # [TOOL_CALLS] is a special token

    def parse(self, text: str, final: bool) -> ParsedTools:
        text = text.removesuffix("</s>")
        start = text.find(TOOL_CALLS)
        if start < 0:
            keep = len(text) if final else len(text) - held_back(text, TOOL_CALLS)
            return ParsedTools(text[:keep], [])
        rest = text[start + len(TOOL_CALLS):].lstrip()
        if rest.startswith("[") or (not rest and not final):
            values, _ = decode_objects(rest)
            items = values[0] if values and isinstance(values[0], list) else values
            calls = [c for c in map(call_from_json, items) if c is not None]
        else:
            calls = self._named_calls(rest)
        return ParsedTools(text[:start], calls)

    @staticmethod
    def _named_calls(rest: str) -> list[ParsedCall]:
        calls = []
        for part in rest.split(TOOL_CALLS):
            name, sep, args = part.partition(ARGS)
            if not sep:
                continue
            values, _ = decode_objects(args)
            if values:
                calls.append(ParsedCall(name.strip(), json.dumps(values[0], ensure_ascii=False)))
        return calls
