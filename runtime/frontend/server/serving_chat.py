"""/v1/chat/completions: messages through the tokenizer's chat template, answered or streamed."""

from __future__ import annotations

import time

from fastapi import Request

from pagoda.runtime.frontend.engine_client import EngineDeadError
from pagoda.runtime.frontend.server.errors import bad_request
from pagoda.runtime.frontend.server.logprobs import ChoiceState, chat_logprobs
from pagoda.runtime.frontend.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    ChatStreamChoice,
    ChoiceLogprobs,
    DeltaMessage,
    UsageInfo,
    random_id,
)
from pagoda.runtime.frontend.server.serving import OpenAIServing, SSEResponse, sse, sse_error, sse_json


class ServingChat(OpenAIServing):
    async def create(self, req: ChatCompletionRequest, raw: Request):
        model = self.check_model(req.model)
        if req.tools:
            raise bad_request("tool calling is not supported", param="tools")
        if req.response_format is not None and req.response_format.type != "text":
            raise bad_request("only response_format type 'text' is supported", param="response_format")
        prompt = self.render(req.messages, req.add_generation_prompt, req.continue_final_message)
        ids = list(self.tokenizer(prompt, add_special_tokens=False).input_ids)
        requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        max_tokens = self.resolve_max_tokens(len(ids), requested, what="messages")
        num_top = req.top_logprobs or 0
        if req.top_logprobs and not req.logprobs:
            raise bad_request("top_logprobs requires logprobs to be true", param="top_logprobs")
        params = self.sampling_params(req, max_tokens, num_top if req.logprobs else None, stream=bool(req.stream))
        request_id = random_id("chatcmpl")
        streams = await self.submit(request_id, [(prompt, ids)], params)
        if req.stream:
            return SSEResponse(self._stream(request_id, model, req, streams[0]), streams)
        (out,) = await self.wait_all(raw, streams)
        return self._response(request_id, model, req, out)

    def render(self, messages: list[ChatMessage], add_generation_prompt: bool = True,
               continue_final_message: bool = False) -> str:
        conversation = [{"role": m.role, "content": m.text()} for m in messages]
        if continue_final_message and (add_generation_prompt or conversation[-1]["role"] != "assistant"):
            raise bad_request("continue_final_message needs a final assistant message and "
                              "add_generation_prompt false", param="continue_final_message")
        try:
            return self.tokenizer.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, chat_template=self.config.chat_template)
        except Exception as exc:  # jinja errors, or a tokenizer without a template
            raise bad_request(f"could not apply the chat template: {exc}", param="messages") from None

    def _logprobs(self, req, token_ids, logprobs) -> ChoiceLogprobs | None:
        if not req.logprobs:
            return None
        return ChoiceLogprobs(content=chat_logprobs(self.tokenizer, token_ids, logprobs or [],
                                                    req.top_logprobs or 0))

    def _response(self, request_id, model, req, out) -> ChatCompletionResponse:
        choices, completion_tokens = [], 0
        for c in sorted(out.outputs, key=lambda c: c.index):
            completion_tokens += len(c.token_ids)
            choices.append(ChatChoice(index=c.index, message=AssistantMessage(content=c.text),
                                      logprobs=self._logprobs(req, c.token_ids, c.logprobs),
                                      finish_reason=c.finish_reason, stop_reason=c.stop_reason))
        prompt_tokens = len(out.prompt_token_ids)
        usage = UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                          total_tokens=prompt_tokens + completion_tokens)
        return ChatCompletionResponse(id=request_id, model=model, choices=choices, usage=usage)

    async def _stream(self, request_id, model, req, stream):
        """Each DELTA output holds only what is new; the frontend already held back what could
        still turn out to start a stop string."""
        created = int(time.time())
        states = [ChoiceState() for _ in range(req.n)]
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(choices, usage=None) -> str:
            return sse(ChatCompletionChunk(id=request_id, created=created, model=model, choices=choices,
                                           usage=usage))

        # OpenAI's first chunk of each choice carries the role and no text.
        yield chunk([ChatStreamChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
                     for i in range(req.n)])
        out = None
        try:
            async for out in stream:
                choices = []
                for c in out.outputs:
                    state = states[c.index]
                    if state.done:
                        continue
                    finished = c.finish_reason is not None
                    text = c.text
                    logprobs = self._logprobs(req, c.token_ids, c.logprobs or [])
                    state.num_tokens += len(c.token_ids)
                    if not text and not finished and not (logprobs and logprobs.content):
                        continue
                    state.done = finished
                    choices.append({"index": c.index, "delta": {"role": None, "content": text or None},
                                    "logprobs": logprobs.model_dump() if logprobs else None,
                                    "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
                if choices:
                    # ChatCompletionChunk's JSON, built from dicts (see sse_json).
                    yield sse_json({"id": request_id, "object": "chat.completion.chunk", "created": created,
                                    "model": model, "choices": choices, "usage": None})
            if include_usage and out is not None:
                prompt_tokens = len(out.prompt_token_ids)
                completion_tokens = sum(state.num_tokens for state in states)
                yield chunk([], UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                          total_tokens=prompt_tokens + completion_tokens))
        except (EngineDeadError, ValueError) as exc:
            yield sse_error(exc)
        yield "data: [DONE]\n\n"
