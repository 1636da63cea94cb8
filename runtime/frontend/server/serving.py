"""What both OpenAI endpoints share: model lookup, limits, sampling params, submitting prompts to the
engine client, and waiting on them while watching for the client to leave."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from fastapi import Request
from starlette.responses import StreamingResponse

from pagoda.runtime.frontend.engine_client import EngineClient, EngineDeadError, RequestStream
from pagoda.runtime.frontend.server.errors import APIError, bad_request, error_body
from pagoda.runtime.frontend.server.protocol import SamplingFields
from pagoda.runtime.frontend.server.renderer import PromptRenderer
from pagoda.runtime.frontend.server.request_options import parse_logit_bias, truncate_prompt
from pagoda.runtime.frontend.server.structured import (
    check_grammar,
    reject_legacy_fields,
    structured_outputs_of,
)
from pagoda.runtime.sampling_params import RequestOutputKind, SamplingParams
from pagoda.runtime.structured_outputs_params import StructuredOutputsParams


@dataclass(slots=True)
class ServerConfig:
    served_model_names: list[str]
    model_path: str
    api_key: str | list[str] | None = None  # any of them opens /v1 (None: no key needed)
    max_queue_len: int | None = None
    chat_template: str | None = None  # a template string (a file is read by the CLI)
    random_weights: bool = False
    disable_log_stats: bool = False
    max_body_bytes: int = 32 << 20
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None  # hermes, llama3_json, mistral
    reasoning_parser: str | None = None  # deepseek_r1, qwen3
    enable_tokenizer_info_endpoint: bool = False  # GET /tokenizer_info (off by default, as in vLLM)
    trust_request_chat_template: bool = False  # a request's own chat_template (chat_template_request.py)


class OpenAIServing:
    def __init__(self, client: EngineClient, config: ServerConfig, renderer: PromptRenderer):
        self.client = client
        self.config = config
        self.renderer = renderer  # chat templates and tokenizing, off the event loop
        self.tokenizer = client.tokenizer
        self.max_model_len = client.max_model_len
        vocab = client.vocab_size or len(self.tokenizer)
        # Ids the model knows but the tokenizer cannot spell would break detokenization.
        self.num_token_ids = min(vocab, len(self.tokenizer))

    @property
    def model_name(self) -> str:
        return self.config.served_model_names[0]

    def check_model(self, model: str | None) -> str:
        if model in (None, "") or model in self.config.served_model_names:
            return self.model_name
        raise APIError(404, f"The model `{model}` does not exist. This server serves "
                       f"{', '.join(self.config.served_model_names)}.", param="model", code="model_not_found")

    def check_token_ids(self, ids: list[int], param: str = "prompt") -> None:
        if ids and (t := max(ids)) >= self.num_token_ids:  # max in C: a prompt may hold a million ids
            raise bad_request(f"token id {t} is out of range: the vocabulary has {self.num_token_ids} "
                              f"tokens (ids 0..{self.num_token_ids - 1})", param=param)

    def resolve_max_tokens(self, prompt_len: int, max_tokens: int | None, what: str = "prompt") -> int:
        """The max_tokens to use, or a 400 that gives the numbers."""
        if prompt_len == 0:
            raise bad_request(f"the {what} is empty: it must hold at least one token", param=what)
        limit = self.max_model_len
        if max_tokens is None:
            max_tokens = min(limit - prompt_len, self.client.generation_defaults.get("max_tokens", limit))
            if max_tokens < 1:
                raise bad_request(
                    f"This model's maximum context length is {limit} tokens. However, you requested "
                    f"{prompt_len} tokens in the {what}, which leaves no room for a completion. Please "
                    f"reduce the length of the {what}.", param=what, code="context_length_exceeded")
            return max_tokens
        if prompt_len + max_tokens > limit:
            raise bad_request(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_len + max_tokens} tokens ({prompt_len} in the {what}, {max_tokens} in the "
                f"completion). Please reduce the length of the {what} or completion.",
                param="max_tokens", code="context_length_exceeded")
        return max_tokens

    def truncate(self, req: SamplingFields, ids: list[int]) -> list[int]:
        return truncate_prompt(ids, req.truncate_prompt_tokens, req.truncation_side, self.max_model_len)

    def check_grammar(self, params: StructuredOutputsParams, field: str) -> None:
        check_grammar(self.client.processor.grammars, params, field)

    def sampling_params(self, req: SamplingFields, max_tokens: int, logprobs: int | None,
                        prompt_logprobs: int | None = None, stream: bool = False,
                        structured: StructuredOutputsParams | None = None) -> SamplingParams:
        """The request's SamplingParams. A stream reads DELTA outputs (each holds only the new
        text); an answer waits for the one FINAL_ONLY output."""
        if req.prompt_logprobs is not None and stream:
            raise bad_request("prompt_logprobs are not available when stream is true", param="prompt_logprobs")
        logit_bias = parse_logit_bias(req.logit_bias)
        if logit_bias:
            self.check_token_ids(list(logit_bias), param="logit_bias")
        if req.allowed_token_ids:
            self.check_token_ids(req.allowed_token_ids, param="allowed_token_ids")
        if structured is None:
            structured = structured_outputs_of(req, self.client.processor.grammars)
        else:
            reject_legacy_fields(req)
        # What the request leaves unset comes from generation_config.json (--generation-config).
        defaults = self.client.generation_defaults

        def pick(name: str, fallback):
            value = getattr(req, name)
            return value if value is not None else defaults.get(name, fallback)

        top_k = pick("top_k", -1)
        if top_k > self.num_token_ids:
            top_k = -1  # keeping more tokens than the vocabulary holds is no truncation at all
        try:
            return SamplingParams(
                n=req.n,
                temperature=pick("temperature", 1.0),
                top_p=pick("top_p", 1.0),
                top_k=top_k,
                min_p=pick("min_p", 0.0),
                presence_penalty=req.presence_penalty or 0.0,
                frequency_penalty=req.frequency_penalty or 0.0,
                repetition_penalty=pick("repetition_penalty", 1.0),
                seed=req.seed,
                stop=req.stop_list(),
                stop_token_ids=list(req.stop_token_ids or []),
                include_stop_str_in_output=req.include_stop_str_in_output,
                ignore_eos=req.ignore_eos,
                max_tokens=max_tokens,
                min_tokens=req.min_tokens,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
                skip_special_tokens=req.skip_special_tokens,
                output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
                structured_outputs=structured,
                logit_bias=logit_bias,
                allowed_token_ids=req.allowed_token_ids,
                bad_words=req.bad_words or None,
            )
        except (ValueError, TypeError) as exc:
            raise bad_request(str(exc), param=getattr(exc, "param", None)) from None

    async def submit(self, request_id: str, prompts: list[tuple[str | None, list[int]]],
                     params: SamplingParams) -> list[RequestStream]:
        """Add every prompt to the engine (one engine request each), or none of them."""
        if self.client.queue_full(len(prompts)):
            raise APIError(429, f"The server's queue is full ({self.client.max_queue_len} requests waiting); "
                           "retry later.", code="queue_full")
        streams: list[RequestStream] = []
        try:
            for i, (text, ids) in enumerate(prompts):
                rid = request_id if len(prompts) == 1 else f"{request_id}-{i}"
                streams.append(await self.client.add_request(rid, text, ids, params))
        except BaseException as exc:
            for s in streams:
                s.close()
            raise engine_error(exc) from None
        return streams

    async def wait_all(self, raw: Request, streams: list[RequestStream]) -> list:
        """The final output of every stream; aborts them all if the client disconnects first."""

        async def last(stream: RequestStream):
            output = None
            while not stream.finished:
                output = await stream.get()  # FINAL_ONLY: the one output holds everything
            return output

        try:
            return await until_disconnect(raw, asyncio.gather(*(last(s) for s in streams)))
        except EngineDeadError as exc:
            raise engine_error(exc) from None
        finally:
            for s in streams:
                s.close()


def engine_error(exc: BaseException) -> BaseException:
    """Map what the engine client raised to the HTTP error the caller should see."""
    if isinstance(exc, EngineDeadError):
        return APIError(503, f"The engine is not running: {exc}", code="engine_unavailable")
    if isinstance(exc, ValueError):
        return bad_request(str(exc), param=getattr(exc, "param", None))
    return exc


class ClientDisconnected(Exception):
    pass


async def until_disconnect(raw: Request, awaitable):
    """Await `awaitable` unless the HTTP client disconnects first; then cancel it."""
    work = asyncio.ensure_future(awaitable)

    async def watch():
        while True:
            message = await raw.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not work.done():
            work.cancel()
    if work.cancelled():
        raise ClientDisconnected()
    return work.result()


def sse(payload) -> str:
    body = payload if isinstance(payload, str) else payload.model_dump_json(exclude_unset=False)
    return f"data: {body}\n\n"


def sse_json(data: dict) -> str:
    """One SSE event from plain data, in the same JSON a pydantic model would write. At full load the
    server writes thousands of chunks a second: json.dumps on dicts costs a fraction of building and
    dumping a model per chunk, so the per-token chunks take this path."""
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


def sse_error(exc: BaseException) -> str:
    err = engine_error(exc)
    if isinstance(err, APIError):
        return f"data: {json.dumps(error_body(err.status, err.message, code=err.code))}\n\n"
    return f"data: {json.dumps(error_body(500, f'{type(exc).__name__}: {exc}'))}\n\n"


class SSEResponse(StreamingResponse):
    """text/event-stream that aborts its engine requests however the response ends, even when the
    client leaves before the body generator ever started."""

    def __init__(self, content, streams: list[RequestStream]):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._streams = streams

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            for s in self._streams:
                s.close()


async def merge_streams(streams: list[RequestStream]):
    """Yield (index, output) from several streams as outputs arrive."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: RequestStream):
        try:
            async for out in stream:
                await queue.put((i, out, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            await queue.put((i, None, exc))
        finally:
            await queue.put((i, None, StopAsyncIteration()))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(streams)
    try:
        while remaining:
            i, out, exc = await queue.get()
            if isinstance(exc, StopAsyncIteration):
                remaining -= 1
            elif exc is not None:
                raise exc
            else:
                yield i, out
    finally:
        for t in tasks:
            t.cancel()
