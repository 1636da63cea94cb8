"""Request and response models for OpenAI's HTTP API, plus vLLM's extra sampling fields.

Pydantic checks types and plain ranges here, at the edge. Anything that reaches the engine must be
safe for every other request in the batch: a NaN temperature or a token id past the vocabulary would
fail a whole step, so those are refused here with a 400 instead of being passed on. The ranges are
SamplingParams' own, declared here so that the error names its field and the OpenAPI schema states
what the server takes. Every string that can reach the tokenizer is `Text`: valid Unicode only
(server/unicode.py).
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from pagoda.runtime.frontend.server import unsupported
from pagoda.runtime.frontend.server.chat_template_request import ChatTemplateFields
from pagoda.runtime.frontend.server.content_parts import TextOnlyMessages
from pagoda.runtime.frontend.server.unicode import Text, check_unicode

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1
MAX_LOGPROBS = 20  # OpenAI allows 20 top logprobs for chat; vLLM's default max_logprobs is 20 too
MAX_N = 128  # OpenAI's limit for `n`

TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
StopString = Annotated[Text, Field(min_length=1)]
JSONObject = Annotated[dict[str, Any], AfterValidator(check_unicode)]


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class _Request(BaseModel):
    # Nested objects ignore unknown fields: clients send back messages with fields of a response
    # (refusal, annotations). A request itself refuses them (SamplingFields, server/unsupported.py).
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class StreamOptions(_Request):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class JsonSchemaFormat(_Request):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True)

    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsRequest(_Request):
    """vLLM's `structured_outputs` request field: exactly one of the first six."""

    json_: str | dict[str, Any] | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)


# vLLM's pre-0.11 fields, now `structured_outputs`: refused, so a client never gets unconstrained text.
LEGACY_GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar",
                        "guided_decoding_backend", "guided_whitespace_pattern")


class SamplingFields(_Request):
    """Fields that both endpoints share: OpenAI's, then vLLM's extras. Any other field is a 400
    (server/unsupported.py), so the schema allows no others."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: Text | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float | None = Field(None, ge=0.0, description="0 means greedy.")
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    presence_penalty: float | None = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(0.0, ge=-2.0, le=2.0)
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: StopString | list[StopString] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[Text, float] | None = None
    user: Text | None = None
    # vLLM's extra sampling fields.
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0**31)
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0, le=INT32_MAX)
    stop_token_ids: list[TokenId] | None = None
    allowed_token_ids: list[TokenId] | None = Field(None, min_length=1)
    bad_words: list[StopString] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    # -1: max_model_len (vLLM's); the kept tokens are the last ones unless truncation_side is "right".
    truncate_prompt_tokens: int | None = Field(None, ge=-1, le=INT64_MAX)
    truncation_side: Literal["left", "right"] | None = None
    return_tokens_as_token_ids: bool | None = None  # logprob tokens as "token_id:N"
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_decoding_backend: Any = None
    guided_whitespace_pattern: Any = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_unimplemented_fields(cls, data):
        return unsupported.refuse_unimplemented(cls, data)

    def _max_tokens(self) -> int | None:
        return getattr(self, "max_tokens", None)

    @model_validator(mode="after")
    def _min_tokens_within_max_tokens(self):
        max_tokens = self._max_tokens()
        if max_tokens is not None and self.min_tokens > max_tokens:
            # The ctx's param names the field: a model-level error has no location of its own.
            raise PydanticCustomError("min_tokens_over_max_tokens",
                                      "min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})",
                                      {"min_tokens": self.min_tokens, "max_tokens": max_tokens,
                                       "param": "min_tokens"})
        return self

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(SamplingFields):
    prompt: Text | list[Text] | list[TokenId] | list[list[TokenId]]
    max_tokens: int | None = Field(16, ge=0, le=INT32_MAX, description="0 only with echo: prompt scoring.")
    echo: bool | None = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    suffix: Text | None = None
    add_special_tokens: bool = Field(True, description="Add the tokenizer's special tokens (BOS, say) to a text prompt.")

    @property
    def scores_prompt(self) -> bool:
        """echo with max_tokens 0: the prompt and its logprobs, no completion (OpenAI's legacy scoring)."""
        return bool(self.echo) and self.max_tokens == 0


class TextContentPart(_Request):
    type: Literal["text"]
    text: Text


class FunctionCall(_Request):
    name: Text
    arguments: Text  # JSON text


class ToolCall(_Request):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextContentPart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: Text | None = None  # a tool turn: which call it answers
    reasoning_content: Text | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionDefinition(_Request):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: Text | None = None
    parameters: JSONObject | None = None
    strict: bool | None = None


class ChatTool(_Request):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedToolChoiceFunction(_Request):
    name: Text


class NamedToolChoice(_Request):
    type: Literal["function"] = "function"
    function: NamedToolChoiceFunction


class ChatCompletionRequest(SamplingFields, ChatTemplateFields, TextOnlyMessages):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX, description="Deprecated by OpenAI.")
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = True
    # vLLM's chat extras (and ChatTemplateFields').
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = Field(False, description="Add the tokenizer's special tokens on top of the "
                                     "template's (most templates write them already).")

    def _max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# ---- responses -----------------------------------------------------------------------------------


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """vLLM's Logprob, as vLLM returns prompt_logprobs: one dict per prompt token, keyed by token id."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[int, PromptLogprob] | None]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: dict[str, str]  # name, arguments (JSON text)


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None
    prompt_logprobs: PromptLogprobs | None = None  # vLLM's


class DeltaMessage(BaseModel):
    role: str | None = None
    content: str | None = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "pagoda"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    random_weights: bool = False
    description: str | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class _ClosedRequest(_Request):
    """A request that refuses fields it does not declare, as the generation routes do."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_fields(cls, data):
        return unsupported.refuse_unimplemented(cls, data, known={})


class TokenizeRequest(_ClosedRequest, ChatTemplateFields, TextOnlyMessages):
    """vLLM's two tokenize requests in one: a `prompt`, or chat `messages` (with the chat fields)."""

    model: Text | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = None
    tools: list[ChatTool] | None = None
    add_special_tokens: bool | None = Field(None, description="Default: true for a prompt, false for messages "
                                            "(their template writes the special tokens).")
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool | None = Field(False, description="Also return each token as the vocabulary spells it.")


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int
    token_strs: list[str] | None = None


class DetokenizeRequest(_ClosedRequest):
    model: Text | None = None
    tokens: list[TokenId]


class DetokenizeResponse(BaseModel):
    prompt: str


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
