"""A request's chat-template options, as vLLM takes them on chat, /tokenize and /v1/embeddings.

`chat_template_kwargs` are variables for the template (Qwen3's `enable_thinking`, say): they reach
transformers' `apply_chat_template` as keyword arguments, and may also override the request's own
add_generation_prompt, continue_final_message, tools and documents, as vLLM merges them. What they
may not set is apply_chat_template's machinery (tokenize, return_dict, ...): the server renders
text and tokenizes it itself, so such a key is a 400, not a silent change of meaning.

A template in the request (`chat_template`, or `chat_template_kwargs.chat_template`) is refused
unless the server runs with --trust-request-chat-template, as vLLM refuses it: a template is a
program run on the tokenizer's one thread, and a loop in it would stall every request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field

from pagoda.runtime.frontend.server.errors import bad_request
from pagoda.runtime.frontend.server.unicode import Text, check_unicode

# apply_chat_template's own parameters that are not the template's business.
MACHINERY = frozenset({"conversation", "tokenize", "return_dict", "return_tensors", "padding", "truncation",
                       "max_length", "tokenizer_kwargs", "return_assistant_tokens_mask"})
UNTRUSTED_TEMPLATE = ("Chat template is passed with request, but --trust-request-chat-template is not set. "
                      "Refused request with untrusted chat template.")  # vLLM's words


class ChatTemplateFields(BaseModel):
    """vLLM's chat-template request fields; each request declares add_generation_prompt,
    continue_final_message and add_special_tokens itself, since their defaults differ."""

    documents: list[dict[str, Text]] | None = Field(
        None, description="Documents for a RAG template (each with `title` and `text`, say).")
    chat_template: Text | None = Field(
        None, description="A Jinja template for this request (needs --trust-request-chat-template).")
    chat_template_kwargs: Annotated[dict[str, Any], AfterValidator(check_unicode)] | None = Field(
        None, description="Variables for the chat template, such as enable_thinking.")


@dataclass(frozen=True, slots=True)
class ChatRender:
    """How to render one conversation: the arguments of apply_chat_template, and of the tokenizer after it."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False  # on top of what the template writes
    tools: list[dict] | None = None
    documents: list[dict] | None = None
    template: str | None = None  # None: the server's
    variables: dict[str, Any] = field(default_factory=dict)


def _flag(kwargs: dict, name: str, default: bool) -> bool:
    value = kwargs.pop(name, default)
    if not isinstance(value, bool):
        raise bad_request(f"chat_template_kwargs.{name} must be a boolean", param="chat_template_kwargs")
    return value


def chat_render(req, *, trust_request_template: bool, tools: list[dict] | None = None,
                add_special_tokens: bool | None = None) -> ChatRender:
    kwargs = dict(req.chat_template_kwargs or {})
    if reserved := sorted(MACHINERY & kwargs.keys()):
        raise bad_request(f"chat_template_kwargs may not set {', '.join(reserved)}: the server renders the "
                          "template to text and tokenizes it itself", param="chat_template_kwargs")
    template = kwargs.pop("chat_template", req.chat_template)
    if template is not None and not trust_request_template:
        raise bad_request(UNTRUSTED_TEMPLATE, param="chat_template", code="untrusted_chat_template")
    if template is not None and not isinstance(template, str):
        raise bad_request("chat_template_kwargs.chat_template must be a string", param="chat_template_kwargs")
    return ChatRender(
        add_generation_prompt=_flag(kwargs, "add_generation_prompt", req.add_generation_prompt),
        continue_final_message=_flag(kwargs, "continue_final_message", req.continue_final_message),
        add_special_tokens=req.add_special_tokens if add_special_tokens is None else add_special_tokens,
        tools=kwargs.pop("tools", tools), documents=kwargs.pop("documents", req.documents),
        template=template, variables=kwargs)
