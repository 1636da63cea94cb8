"""`tools` and `tool_choice` on chat completions, as vLLM serves them.

- none: tools reach the chat template, and the text is plain content.
- auto: the --tool-call-parser reads tool calls out of the model's own format; it needs
  --enable-auto-tool-choice (a 400 otherwise). It is the default when tools are given.
- required, or a named function: structured outputs force the answer, so the arguments always
  parse and match the tool's parameters: a JSON list of {"name", "parameters"} over the tools'
  schemas, or the named function's arguments object.
"""

from __future__ import annotations

from pagoda.runtime.frontend.server.errors import bad_request
from pagoda.runtime.frontend.server.protocol import ChatCompletionRequest, NamedToolChoice
from pagoda.runtime.structured_outputs_params import StructuredOutputsParams

ANY_OBJECT = {"type": "object"}


def resolve_tool_choice(req: ChatCompletionRequest, auto_enabled: bool) -> str | None:
    """"none", "auto", "required", a function's name, or None when no tools are given."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise bad_request("tool_choice needs tools", param="tool_choice")
        return None
    if choice is None:
        choice = "auto"
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if name not in {t.function.name for t in req.tools}:
            raise bad_request(f"tool_choice names function {name!r}, which is not in tools", param="tool_choice")
        choice = name
    elif choice == "auto" and not auto_enabled:
        raise bad_request('"auto" tool choice requires the server to run with --enable-auto-tool-choice and '
                          '--tool-call-parser; use tool_choice "required" or a named function instead',
                          param="tool_choice")
    if choice not in ("none", "auto") and (req.structured_outputs is not None or
                                           (req.response_format is not None and req.response_format.type != "text")):
        raise bad_request("a forced tool_choice cannot be combined with response_format or structured_outputs",
                          param="tool_choice")
    return choice


def forced_grammar(req: ChatCompletionRequest, choice: str) -> StructuredOutputsParams | None:
    """The grammar that forces `choice` ("required" or a function name), or None."""
    if choice in ("none", "auto"):
        return None
    if choice != "required":
        tool = next(t for t in req.tools if t.function.name == choice)
        return StructuredOutputsParams(json=tool.function.parameters or ANY_OBJECT)
    calls = [{"type": "object",
              "properties": {"name": {"type": "string", "enum": [t.function.name]},
                             "parameters": t.function.parameters or ANY_OBJECT},
              "required": ["name", "parameters"]}
             for t in req.tools]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if req.parallel_tool_calls is False:
        schema["maxItems"] = 1
    return StructuredOutputsParams(json=schema)
