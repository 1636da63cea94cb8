"""A chat choice's text -> OpenAI's assistant message: reasoning_content, content and tool_calls.

The reasoning parser runs first (--reasoning-parser), then the tool-call parser on what is left
(--tool-call-parser, for tool_choice "auto"). A forced tool choice needs no parser: the grammar
made the text a JSON list of {"name", "parameters"} ("required") or the function's arguments (a
named function). A stream keeps one StreamDiffer per choice: each chunk re-reads the whole text
and sends what the parsers newly answer (see tool_parsers: their answers only ever grow), so the
streamed deltas add up to the non-streamed message. A parsed call is sent once complete, except a
named function's, whose arguments are the text itself and stream as they are written.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from pagoda.runtime.frontend.reasoning import ReasoningParser
from pagoda.runtime.frontend.tool_parsers import ParsedCall, ToolParser, call_from_json


def tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex[:24]}"


@dataclass(slots=True)
class ParsedMessage:
    reasoning: str | None
    content: str
    calls: list[ParsedCall]


@dataclass(slots=True)
class MessageParser:
    reasoning: ReasoningParser | None = None
    tools: ToolParser | None = None  # tool_choice "auto"
    forced: str | None = None  # "required", or the name of the function tool_choice names

    @property
    def active(self) -> bool:
        return self.reasoning is not None or self.tools is not None or self.forced is not None

    def parse(self, text: str, final: bool) -> ParsedMessage:
        reasoning = None
        if self.reasoning is not None:
            r = self.reasoning.parse(text, final)
            reasoning, text = r.reasoning, r.content
        calls: list[ParsedCall] = []
        if self.forced is not None:
            calls = forced_calls(self.forced, text, final)
            text = "" if calls or not final else text
        elif self.tools is not None:
            t = self.tools.parse(text, final)
            text, calls = t.content, t.calls
        # Whitespace alone is no content yet (a call may follow it), and none at all beside calls.
        return ParsedMessage(reasoning, text if text.strip() else "", calls)


def forced_calls(forced: str, text: str, final: bool = True) -> list[ParsedCall]:
    """The calls a forced tool choice's grammar wrote (none if it was cut short, e.g. by length).
    A named function's arguments are the text itself, so they stream as it grows."""
    if not final:
        return [ParsedCall(forced, text)] if forced != "required" and text.strip() else []
    try:
        value = json.loads(text)
    except ValueError:
        return []
    if forced != "required":
        return [ParsedCall(forced, text)]
    items = value if isinstance(value, list) else []
    return [c for c in map(call_from_json, items) if c is not None]


def tool_call_dicts(calls: list[ParsedCall], start: int = 0) -> list[dict]:
    return [{"index": start + i, "id": tool_call_id(), "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for i, c in enumerate(calls)]


@dataclass(slots=True)
class StreamDiffer:
    parser: MessageParser
    text: str = ""
    sent_reasoning: int = 0
    sent_content: int = 0
    sent_arguments: list[int] = field(default_factory=list)  # per call, the arguments sent so far

    @property
    def sent_calls(self) -> int:
        return len(self.sent_arguments)

    def delta(self, new_text: str, final: bool) -> dict:
        """The delta fields (reasoning_content, content, tool_calls) that new_text adds."""
        self.text += new_text
        m = self.parser.parse(self.text, final)
        delta = {}
        reasoning = m.reasoning or ""
        if len(reasoning) > self.sent_reasoning:
            delta["reasoning_content"] = reasoning[self.sent_reasoning:]
            self.sent_reasoning = len(reasoning)
        if len(m.content) > self.sent_content:
            delta["content"] = m.content[self.sent_content:]
            self.sent_content = len(m.content)
        calls = []
        for i, call in enumerate(m.calls):
            if i == len(self.sent_arguments):  # a new call: its id and name, and its arguments so far
                calls += tool_call_dicts([call], i)
                self.sent_arguments.append(len(call.arguments))
            elif len(call.arguments) > self.sent_arguments[i]:  # arguments that grew (a named function)
                calls.append({"index": i, "function": {"arguments": call.arguments[self.sent_arguments[i]:]}})
                self.sent_arguments[i] = len(call.arguments)
        if calls:
            delta["tool_calls"] = calls
        return delta
