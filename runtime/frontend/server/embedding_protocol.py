"""/v1/embeddings' request and response, in OpenAI's shape with vLLM's extra fields."""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pagoda.runtime.frontend.server import unsupported
from pagoda.runtime.frontend.server.chat_template_request import ChatTemplateFields
from pagoda.runtime.frontend.server.content_parts import TextOnlyMessages
from pagoda.runtime.frontend.server.protocol import ChatMessage, TokenId, UsageInfo, _Request
from pagoda.runtime.frontend.server.unicode import Text

# vLLM's embedding fields that Pagoda does not implement -> the values that ask for nothing (as in
# server/unsupported.py): those are dropped, any other value is a 400 naming the field, and a field
# nobody defines is a 400 as well, never a silent 200.
NOT_IMPLEMENTED: dict[str, tuple] = {
    "embed_dtype": ("float32",),
    "endianness": ("native",),
    "mm_processor_kwargs": unsupported.ANY,
    "priority": (0,),
    "request_id": unsupported.ANY,
    "cache_salt": unsupported.ANY,
    "use_activation": (True,),  # vLLM's newer name for normalize; send `normalize`
    "media_io_kwargs": unsupported.ANY,
}


class EmbeddingRequest(_Request, ChatTemplateFields, TextOnlyMessages):
    """OpenAI's `input`, or vLLM's chat-style `messages` (one conversation, through the chat template)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: Text | None = None
    input: Text | list[Text] | list[TokenId] | list[list[TokenId]] | None = None
    messages: list[ChatMessage] | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, description="Only for matryoshka models.")
    user: Text | None = None  # accepted and ignored, as OpenAI's own
    # vLLM's extras.
    truncate_prompt_tokens: int | None = Field(None, ge=-1, description="Keep the input's last k tokens "
                                               "(-1: the last max_model_len).")
    add_special_tokens: bool | None = Field(None, description="Default: true for input, false for messages "
                                            "(their template writes the special tokens).")
    # With messages (vLLM's EmbeddingChatRequest): no generation prompt by default.
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    normalize: bool | None = Field(None, description="L2-normalize (default: the model's pooler config).")

    @model_validator(mode="before")
    @classmethod
    def _refuse_unimplemented_fields(cls, data):
        return unsupported.refuse_unimplemented(cls, data, known=NOT_IMPLEMENTED)


class EmbeddingData(BaseModel):
    index: int
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str  # a base64 string of little-endian float32 with encoding_format=base64


class EmbeddingResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[EmbeddingData]
    usage: UsageInfo
