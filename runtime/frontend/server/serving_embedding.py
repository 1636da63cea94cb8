"""/v1/embeddings on a server started with --runner pooling (vLLM's pooling runner).

The input is a text, a list of texts, a list of token ids or a list of those; each becomes one
engine request that is prefilled and pooled (worker/pooler.py), and the vectors come back as
floats or, with encoding_format=base64, as little-endian float32 bytes (what the openai SDK asks
for by default, and decodes with numpy). On a server that generates text the route answers 400,
and on a pooling server the text routes do, with vLLM's messages.
"""

from __future__ import annotations

import base64

import numpy as np
from fastapi import Request

from pagoda.runtime.frontend.server.chat_template_request import chat_render
from pagoda.runtime.frontend.server.embedding_protocol import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
)
from pagoda.runtime.frontend.server.errors import bad_request
from pagoda.runtime.frontend.server.protocol import UsageInfo, random_id
from pagoda.runtime.frontend.server.serving import OpenAIServing
from pagoda.runtime.frontend.server.serving_chat import template_message
from pagoda.runtime.pooling_config import matryoshka_dimensions
from pagoda.runtime.pooling_params import PoolingParams


def check_runner(client, api: str, pooling: bool) -> None:
    """A 400 when the route needs the other runner (vLLM: "The model does not support ... API")."""
    if (client.pooler_config is not None) != pooling:
        raise bad_request(f"The model does not support {api} API", code="unsupported_api")


class ServingEmbedding(OpenAIServing):
    async def create(self, req: EmbeddingRequest, raw: Request, max_inputs: int) -> EmbeddingResponse:
        check_runner(self.client, "Embeddings", pooling=True)
        model = self.check_model(req.model)
        params = PoolingParams(self._dimensions(req.dimensions, model), req.normalize, req.truncate_prompt_tokens)
        prompts = await self._inputs(req, max_inputs)
        request_id = random_id("embd")
        outputs = await self.wait_all(raw, await self.submit(request_id, prompts, params))
        data = [EmbeddingData(index=i, embedding=encode(o.outputs.data.numpy(), req.encoding_format))
                for i, o in enumerate(outputs)]
        num_tokens = sum(len(ids) for _, ids in prompts)
        return EmbeddingResponse(id=request_id, model=model, data=data,
                                 usage=UsageInfo(prompt_tokens=num_tokens, total_tokens=num_tokens))

    def _dimensions(self, dimensions: int | None, model: str) -> int | None:
        if dimensions is None:
            return None
        allowed = matryoshka_dimensions(self.client.model_config.hf_config)
        if allowed is False:
            raise bad_request(f'Model "{model}" does not support matryoshka representation, changing output '
                              "dimensions will lead to poor results.", param="dimensions")
        if isinstance(allowed, list) and dimensions not in allowed:
            raise bad_request(f'Model "{model}" only supports {allowed} for matryoshka representation, got '
                              f"{dimensions}", param="dimensions")
        # the embedding's size: the last Dense projection's, else the hidden size
        size = self.client.pooler_config.dimension or self.client.model_config.hidden_size
        if dimensions > size:
            raise bad_request(f"dimensions ({dimensions}) is more than the model's {size}", param="dimensions")
        return dimensions

    async def _inputs(self, req: EmbeddingRequest, max_inputs: int) -> list[tuple[str | None, list[int]]]:
        if (req.input is None) == (req.messages is None):
            raise bad_request("give exactly one of input or messages", param="input")
        if req.messages is not None:
            return [await self._conversation(req)]
        value = req.input
        if isinstance(value, str) or (value and isinstance(value[0], int)):
            value = [value]
        if not value:
            raise bad_request("input must not be empty", param="input")
        if len(value) > max_inputs:
            raise bad_request(f"input holds {len(value)} inputs; this server takes at most {max_inputs} in one "
                              "request", param="input", code="too_many_prompts")
        truncate = req.truncate_prompt_tokens
        self._check_truncation(truncate)
        if isinstance(value[0], str):
            if any(not text for text in value):
                raise bad_request("input must not contain an empty string", param="input")
            special = req.add_special_tokens is not False
            if truncate is None:
                ids = await self.renderer.encode_many(value, special, what="input")
            else:  # a long text may be cut to fit: tokenized whole (on the tokenizer's thread), then cut
                ids = await self.renderer._run(lambda: [self.renderer._encode(t, special) for t in value])
            prompts = list(zip(value, ids, strict=True))
        else:
            prompts = [(None, list(ids)) for ids in value]
        for _, ids in prompts:
            if not ids:
                raise bad_request("input must not contain an empty list of token ids", param="input")
            self.check_token_ids(ids, param="input")
        return self._fit(prompts, truncate)

    async def _conversation(self, req: EmbeddingRequest) -> tuple[str, list[int]]:
        """vLLM's chat-style embedding request: the conversation rendered by the chat template."""
        if not req.messages:
            raise bad_request("messages must not be empty", param="messages")
        self._check_truncation(req.truncate_prompt_tokens)
        render = chat_render(req, trust_request_template=self.config.trust_request_chat_template,
                             add_special_tokens=bool(req.add_special_tokens))
        if req.truncate_prompt_tokens is None:
            text, ids = await self.renderer.encode_chat([template_message(m) for m in req.messages], render)
        else:  # tokenized whole, then cut, as a truncated text input is
            text = await self.renderer.render_chat([template_message(m) for m in req.messages], render)
            ids = await self.renderer._run(self.renderer._encode, text, render.add_special_tokens)
        (prompt,) = self._fit([(text, ids)], req.truncate_prompt_tokens, param="messages")
        return prompt

    def _check_truncation(self, truncate: int | None) -> None:
        if truncate is not None and truncate > self.max_model_len:
            raise bad_request(f"truncate_prompt_tokens value ({truncate}) is greater than max_model_len "
                              f"({self.max_model_len}). Please, select a smaller truncation size.",
                              param="truncate_prompt_tokens")

    def _fit(self, prompts: list[tuple[str | None, list[int]]], truncate: int | None, param: str = "input"):
        """Each prompt cut as truncate_prompt_tokens asks, then held to the context length."""
        limit = self.max_model_len
        if truncate is not None:
            keep = limit if truncate == -1 else truncate
            prompts = [(text, ids[-keep:] if keep else []) for text, ids in prompts]
        for _, ids in prompts:
            if not ids:
                raise bad_request("truncate_prompt_tokens=0 leaves no input", param="truncate_prompt_tokens")
            if len(ids) > limit:
                raise bad_request(f"This model's maximum context length is {limit} tokens. However, you requested "
                                  f"{len(ids)} tokens in the input for embedding generation. Please reduce the "
                                  "length of the input.", param=param, code="context_length_exceeded")
        return prompts


def encode(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()
