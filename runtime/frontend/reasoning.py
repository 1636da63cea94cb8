"""Reasoning parsers (vLLM's --reasoning-parser): the <think>...</think> part of an answer goes to
`reasoning_content`, the rest to `content`.

- deepseek_r1: the chat template opens <think> in the prompt, so the answer starts in reasoning
  (a leading <think> is dropped too) until </think>; with no </think>, it is all reasoning.
- qwen3: reasoning only when the answer starts with <think>; otherwise it is all content.

parse(text, final=False) answers only what more text cannot change (see tool_parsers).
"""

from __future__ import annotations

from dataclasses import dataclass

from pagoda.runtime.frontend.tool_parsers import held_back

START, END = "<think>", "</think>"
REASONING_PARSERS = ("deepseek_r1", "qwen3")


@dataclass(slots=True)
class ParsedReasoning:
    reasoning: str | None
    content: str


class ReasoningParser:
    def __init__(self, name: str):
        if name not in REASONING_PARSERS:
            raise ValueError(f"unknown reasoning parser {name!r}; choose one of {', '.join(REASONING_PARSERS)}")
        self.name = name

    def parse(self, text: str, final: bool) -> ParsedReasoning:
        body = text.lstrip()
        if self.name == "qwen3":
            if not body.startswith(START):
                if not final and START.startswith(body):
                    return ParsedReasoning(None, "")  # may still become <think>
                return ParsedReasoning(None, text)
        if body.startswith(START):
            body = body[len(START):]
        elif not final and START.startswith(body):
            return ParsedReasoning("", "")
        else:
            body = text
        end = body.find(END)
        if end < 0:
            keep = len(body) if final else len(body) - held_back(body, END)
            return ParsedReasoning(body[:keep], "")
        # The newlines a template puts after </think> are not part of the answer.
        return ParsedReasoning(body[:end], body[end + len(END):].lstrip("\n"))
