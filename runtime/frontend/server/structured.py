"""Structured outputs over HTTP: `response_format` (OpenAI) and `structured_outputs` (vLLM) become
one StructuredOutputsParams, checked by xgrammar's parsers before the request is submitted, so a
bad schema, regex or grammar is a 400 that names the field and quotes the parser."""

from __future__ import annotations

from pagoda.runtime.frontend.server.errors import bad_request
from pagoda.runtime.frontend.server.protocol import LEGACY_GUIDED_FIELDS, SamplingFields
from pagoda.runtime.frontend.structured_outputs import GrammarChecker, InvalidGrammar
from pagoda.runtime.structured_outputs_params import StructuredOutputsParams


def reject_legacy_fields(req: SamplingFields) -> None:
    for name in LEGACY_GUIDED_FIELDS:
        if getattr(req, name) is not None:
            raise bad_request(f"{name} is no longer supported (vLLM removed the guided_* fields): use "
                              f"structured_outputs, e.g. {{\"structured_outputs\": {{\"{_replacement(name)}\": "
                              "...}}, or response_format", param=name)


def _replacement(name: str) -> str:
    return {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
            "guided_grammar": "grammar"}.get(name, "json")


def structured_outputs_of(req: SamplingFields, checker: GrammarChecker) -> StructuredOutputsParams | None:
    """The request's grammar, checked, or None; a 400 naming the field when it is wrong."""
    reject_legacy_fields(req)
    fmt, so = req.response_format, req.structured_outputs
    if so is not None and fmt is not None and fmt.type != "text":
        raise bad_request("give response_format or structured_outputs, not both", param="structured_outputs")
    try:
        if so is not None:
            if so.whitespace_pattern is not None:
                raise bad_request("structured_outputs.whitespace_pattern is not supported by the xgrammar "
                                  "backend; use disable_any_whitespace", param="structured_outputs")
            params = StructuredOutputsParams(
                json=so.json_, regex=so.regex, choice=so.choice, grammar=so.grammar, json_object=so.json_object,
                structural_tag=so.structural_tag, disable_any_whitespace=so.disable_any_whitespace,
                disable_additional_properties=so.disable_additional_properties)
            field = "structured_outputs"
        elif fmt is None or fmt.type == "text":
            return None
        elif fmt.type == "json_object":
            params, field = StructuredOutputsParams(json_object=True), "response_format"
        else:
            js = fmt.json_schema
            if js is None:
                raise bad_request("response_format type json_schema needs a json_schema object",
                                  param="response_format")
            schema = js.json_schema
            params = StructuredOutputsParams(json=schema) if schema is not None else \
                StructuredOutputsParams(json_object=True)
            field = "response_format.json_schema.schema"
    except ValueError as exc:
        raise bad_request(str(exc), param="structured_outputs" if so is not None else "response_format") from None
    check_grammar(checker, params, field)
    return params


def check_grammar(checker: GrammarChecker, params: StructuredOutputsParams, field: str) -> None:
    try:
        checker.check(params, field)
    except InvalidGrammar as exc:
        raise bad_request(str(exc), param=exc.param) from None
