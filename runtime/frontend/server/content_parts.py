"""Chat content parts other than text (images, audio, video, files): a 400 that names the part and
says the server serves text only.

Pagoda runs the language model of an image-text checkpoint (models/text_only.py) and nothing that
reads pixels or sound. Without this check such a part failed the text part's schema, with an error
that said "Input should be 'text'" about `messages`; a client sending an image should be told
which part and why, in OpenAI's error shape, before anything is tokenized.
"""

from __future__ import annotations

from pydantic import BaseModel, model_validator
from pydantic_core import PydanticCustomError

# OpenAI's part types and vLLM's multimodal extensions
MEDIA_PART_TYPES = ("image_url", "input_image", "image", "image_pil", "image_embeds", "input_audio", "audio_url",
                    "video_url", "file", "input_file")


def refuse_media_parts(data):
    """A mode="before" validator's body, for every request that carries chat `messages`."""
    messages = data.get("messages") if isinstance(data, dict) else None
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in MEDIA_PART_TYPES:
                # The ctx's param names the part: a model-level error has no location of its own.
                raise PydanticCustomError(
                    "unsupported_content_part",
                    "content part of type '{kind}' is not supported: this server serves text only "
                    "(send text parts, or the content as a string)",
                    {"kind": kind, "param": f"messages[{i}].content[{j}]"})
    return data


class TextOnlyMessages(BaseModel):
    """Mixin for the requests that carry chat `messages` (chat, tokenize, embeddings)."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_media_parts(cls, data):
        return refuse_media_parts(data)
