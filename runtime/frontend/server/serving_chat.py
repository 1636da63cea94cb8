"""/v1/chat/completions: messages (and tools) through the tokenizer's chat template, answered or
streamed; tool calls and reasoning are read out of the text by chat_output's parsers."""

from __future__ import annotations

import json
import time

from fastapi import Request

from pagoda.runtime.frontend.engine_client import EngineDeadError
from pagoda.runtime.frontend.reasoning import ReasoningParser
from pagoda.runtime.frontend.server.chat_output import MessageParser, StreamDiffer, tool_call_dicts
from pagoda.runtime.frontend.server.chat_template_request import chat_render
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
    random_id,
)
from pagoda.runtime.frontend.server.request_options import prompt_logprobs_json, usage
from pagoda.runtime.frontend.server.serving import OpenAIServing, SSEResponse, sse, sse_error, sse_json
from pagoda.runtime.frontend.server.tool_choice import forced_grammar, resolve_tool_choice
from pagoda.runtime.frontend.tool_parsers import get_tool_parser


class ServingChat(OpenAIServing):
    def __init__(self, client, config, renderer):
        super().__init__(client, config, renderer)
        self.tool_parser = get_tool_parser(config.tool_call_parser) if config.tool_call_parser else None
        self.reasoning_parser = ReasoningParser(config.reasoning_parser) if config.reasoning_parser else None

    async def create(self, req: ChatCompletionRequest, raw: Request):
        model = self.check_model(req.model)
        choice = resolve_tool_choice(req, self.config.enable_auto_tool_choice and self.tool_parser is not None)
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        render = chat_render(req, tools=tools, trust_request_template=self.config.trust_request_chat_template)
        prompt, ids = await self.renderer.encode_chat([template_message(m) for m in req.messages], render)
        kept = self.truncate(req, ids)
        if len(kept) != len(ids):
            prompt, ids = None, kept
        requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        max_tokens = self.resolve_max_tokens(len(ids), requested, what="messages")
        num_top = req.top_logprobs or 0
        if req.top_logprobs and not req.logprobs:
            raise bad_request("top_logprobs requires logprobs to be true", param="top_logprobs")
        forced = forced_grammar(req, choice) if choice else None
        if forced is not None:
            self.check_grammar(forced, "tools")
        params = self.sampling_params(req, max_tokens, num_top if req.logprobs else None, req.prompt_logprobs,
                                      stream=bool(req.stream), structured=forced)
        # A grammar writes the whole answer, with no thinking in front of it: no reasoning to split off.
        reasoning = self.reasoning_parser if params.structured_outputs is None else None
        parser = MessageParser(reasoning, self.tool_parser if choice == "auto" else None,
                               choice if forced is not None else None)
        if parser.tools is not None and parser.tools.keep_special_tokens:
            params = params.clone(skip_special_tokens=False)  # the parser reads its marker tokens
        request_id = random_id("chatcmpl")
        streams = await self.submit(request_id, [(prompt, ids)], params)
        if req.stream:
            return SSEResponse(self._stream(request_id, model, req, streams[0], parser, ids), streams)
        (out,) = await self.wait_all(raw, streams)
        return self._response(request_id, model, req, out, parser)

    def _logprobs(self, req, token_ids, logprobs) -> ChoiceLogprobs | None:
        if not req.logprobs:
            return None
        return ChoiceLogprobs(content=chat_logprobs(self.tokenizer, token_ids, logprobs or [],
                                                    req.top_logprobs or 0, bool(req.return_tokens_as_token_ids)))

    def _message(self, text: str, parser: MessageParser) -> AssistantMessage:
        if not parser.active:
            return AssistantMessage(content=text)
        m = parser.parse(text, final=True)
        return AssistantMessage(content=None if m.calls and not m.content else m.content,
                                reasoning_content=m.reasoning, tool_calls=tool_call_dicts(m.calls))

    @staticmethod
    def _finish_reason(finish_reason: str | None, parser: MessageParser, has_calls: bool) -> str | None:
        # OpenAI says "tool_calls" when the model chose to call; a named function ends "stop".
        if finish_reason == "stop" and has_calls and (parser.tools is not None or parser.forced == "required"):
            return "tool_calls"
        return finish_reason

    def _response(self, request_id, model, req, out, parser: MessageParser) -> ChatCompletionResponse:
        choices, completion_tokens = [], 0
        for c in sorted(out.outputs, key=lambda c: c.index):
            completion_tokens += len(c.token_ids)
            message = self._message(c.text, parser)
            choices.append(ChatChoice(index=c.index, message=message,
                                      logprobs=self._logprobs(req, c.token_ids, c.logprobs),
                                      finish_reason=self._finish_reason(c.finish_reason, parser,
                                                                        bool(message.tool_calls)),
                                      stop_reason=c.stop_reason))
        return ChatCompletionResponse(id=request_id, model=model, choices=choices,
                                      usage=usage(len(out.prompt_token_ids), completion_tokens),
                                      prompt_logprobs=prompt_logprobs_json(out.prompt_logprobs))

    async def _stream(self, request_id, model, req, stream, parser: MessageParser, stream_prompt_ids: list[int]):
        """Each DELTA output holds only what is new; the frontend already held back what could
        still turn out to start a stop string."""
        created = int(time.time())
        states = [ChoiceState() for _ in range(req.n)]
        differs = [StreamDiffer(parser) for _ in range(req.n)] if parser.active else None
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        # vLLM's continuous_usage_stats: the usage so far on every chunk (with include_usage).
        continuous = include_usage and bool(req.stream_options.continuous_usage_stats)
        num_prompt = len(stream_prompt_ids)

        def chunk(choices, total=None) -> str:
            return sse(ChatCompletionChunk(id=request_id, created=created, model=model, choices=choices,
                                           usage=total))

        # OpenAI's first chunk of each choice carries the role and no text.
        yield chunk([ChatStreamChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
                     for i in range(req.n)], usage(num_prompt, 0) if continuous else None)
        out = None
        try:
            async for out in stream:
                choices = []
                for c in out.outputs:
                    state = states[c.index]
                    if state.done:
                        continue
                    finished = c.finish_reason is not None
                    logprobs = self._logprobs(req, c.token_ids, c.logprobs or [])
                    state.num_tokens += len(c.token_ids)
                    finish_reason = c.finish_reason
                    if differs is None:
                        delta = {"role": None, "content": c.text or None}
                    else:
                        differ = differs[c.index]
                        delta = differ.delta(c.text, finished)
                        finish_reason = self._finish_reason(finish_reason, parser, differ.sent_calls > 0)
                    if not any(delta.get(k) for k in ("content", "reasoning_content", "tool_calls")) \
                            and not finished and not (logprobs and logprobs.content):
                        continue
                    state.done = finished
                    choices.append({"index": c.index, "delta": delta,
                                    "logprobs": logprobs.model_dump() if logprobs else None,
                                    "finish_reason": finish_reason, "stop_reason": c.stop_reason})
                if choices:
                    # ChatCompletionChunk's JSON, built from dicts (see sse_json).
                    so_far = usage(num_prompt, sum(st.num_tokens for st in states)).model_dump() if continuous else None
                    yield sse_json({"id": request_id, "object": "chat.completion.chunk", "created": created,
                                    "model": model, "choices": choices, "usage": so_far})
            if include_usage and out is not None:
                yield chunk([], usage(num_prompt, sum(state.num_tokens for state in states)))
        except (EngineDeadError, ValueError) as exc:
            yield sse_error(exc)
        yield "data: [DONE]\n\n"


def template_message(m: ChatMessage) -> dict:
    """A message as chat templates read it: tool-call arguments as objects (as vLLM passes them)."""
    message = {"role": m.role, "content": m.text()}
    if m.name is not None:
        message["name"] = m.name
    if m.tool_call_id is not None:
        message["tool_call_id"] = m.tool_call_id
    if m.reasoning_content is not None:
        message["reasoning_content"] = m.reasoning_content
    if m.tool_calls:
        calls = []
        for call in m.tool_calls:
            try:
                arguments = json.loads(call.function.arguments)
            except ValueError:
                arguments = call.function.arguments
            calls.append({"id": call.id, "type": "function",
                          "function": {"name": call.function.name, "arguments": arguments}})
        message["tool_calls"] = calls
    return message
