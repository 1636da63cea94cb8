"""StructuredOutputsParams: the grammar a request's output must follow (vLLM's names and fields).

Exactly one of json, regex, choice, grammar, json_object or structural_tag is given. The engine
compiles it with xgrammar (pagoda.runtime.core.structured_outputs) and masks every sampled token
to it; the frontend checks it first (pagoda.runtime.frontend.structured_outputs), so a bad one is
a ValueError at the door, never a failed step.
"""

from __future__ import annotations

import json as _json
from dataclasses import dataclass
from typing import Any

KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass(slots=True)
class StructuredOutputsParams:
    json: str | dict[str, Any] | None = None  # a JSON schema (a dict or its JSON text)
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # EBNF (GBNF), or Lark
    json_object: bool | None = None  # any JSON object
    structural_tag: str | None = None  # xgrammar's structural tag, as JSON text
    disable_any_whitespace: bool = False  # JSON without free whitespace between tokens
    disable_additional_properties: bool = False  # accepted for vLLM parity: xgrammar is strict already

    def __post_init__(self) -> None:
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError("structured_outputs needs exactly one of json, regex, choice, grammar, "
                             f"json_object or structural_tag; got {given or 'none'}")
        if self.choice is not None:
            if not isinstance(self.choice, list) or not self.choice or \
                    not all(isinstance(c, str) for c in self.choice):
                raise ValueError("structured_outputs.choice must be a non-empty list of strings")
        for name in ("regex", "grammar", "structural_tag"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"structured_outputs.{name} must be a string")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    def key(self) -> tuple[str, str]:
        """(kind, spec text): what the compiled grammar depends on, and its cache key."""
        kind = self.kind
        if kind == "json":
            spec = self.json if isinstance(self.json, str) else _json.dumps(self.json)  # key order matters
        elif kind == "choice":
            spec = _json.dumps(self.choice)
        elif kind == "json_object":
            spec = ""
        else:
            spec = getattr(self, kind)
        if kind in ("json", "json_object") and self.disable_any_whitespace:
            kind += ":compact"
        return kind, spec
