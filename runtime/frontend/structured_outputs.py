"""The frontend's half of structured outputs: check a grammar at the door, describe the tokenizer.

A request's grammar is parsed here, with xgrammar's own parsers, before the request reaches the
engine: a bad JSON schema, regex or EBNF is a ValueError that names the field and carries the
parser's message (a 400 over HTTP), and the core only ever compiles grammars that parse. The
results are cached by grammar, so a schema sent with every request is parsed once.

The core compiles against xgrammar's TokenizerInfo (the vocabulary as bytes, its type, the stop
tokens). The core holds no tokenizer, so the frontend builds it, once, and sends it serialized
before the first structured request (EngineCore.init_structured_outputs).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from pagoda.runtime.core.structured_outputs import choice_as_ebnf, looks_like_lark, parser_message
from pagoda.runtime.structured_outputs_params import StructuredOutputsParams

CHECKED_ENTRIES = 1024


class InvalidGrammar(ValueError):
    """A structured-output spec that does not parse; `param` names the request field it came in."""

    def __init__(self, message: str, param: str = "structured_outputs"):
        super().__init__(message)
        self.param = param


class GrammarChecker:
    def __init__(self, tokenizer, vocab_size: int):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._checked: OrderedDict[tuple[str, str], str | None] = OrderedDict()  # key -> error
        self._info_json: str | None = None
        self._lock = threading.Lock()

    def check(self, params: StructuredOutputsParams, field: str = "structured_outputs") -> None:
        """Raise InvalidGrammar (naming `field`) unless xgrammar parses the spec."""
        key = params.key()
        if key in self._checked:
            self._checked.move_to_end(key)
            error = self._checked[key]
        else:
            error = parse_error(params)
            self._checked[key] = error
            while len(self._checked) > CHECKED_ENTRIES:
                self._checked.popitem(last=False)
        if error is not None:
            raise InvalidGrammar(f"{field}: {error}", param=field.split(".")[0])

    def tokenizer_info_json(self) -> str:
        with self._lock:
            if self._info_json is None:
                import xgrammar as xgr

                info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size)
                self._info_json = info.serialize_json()
            return self._info_json


def parse_error(params: StructuredOutputsParams) -> str | None:
    """What is wrong with the spec, in the parser's words, or None when it parses."""
    import xgrammar as xgr

    kind = params.kind
    try:
        if kind == "json":
            schema = params.json
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except ValueError as exc:
                    return f"the JSON schema is not JSON: {exc}"
            if not isinstance(schema, (dict, bool)):
                return "the JSON schema must be an object"
            xgr.Grammar.from_json_schema(json.dumps(schema))
        elif kind == "regex":
            if "\x00" in params.regex:
                return "the regex must not contain a NUL character"
            xgr.Grammar.from_regex(params.regex)
        elif kind == "choice":
            xgr.Grammar.from_ebnf(choice_as_ebnf(params.choice))
        elif kind == "grammar":
            if looks_like_lark(params.grammar):
                xgr.Grammar.from_lark(params.grammar)
            else:
                xgr.Grammar.from_ebnf(params.grammar)
        elif kind == "structural_tag":
            xgr.Grammar.from_structural_tag(params.structural_tag)
    except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError and friends
        return f"invalid {kind.replace('_', ' ')}: {parser_message(exc)}"
    return None
