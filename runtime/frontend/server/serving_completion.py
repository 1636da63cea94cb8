"""/v1/completions: prompts as text, a list of texts, token ids or lists of token ids."""

from __future__ import annotations

import time

from fastapi import Request

from pagoda.runtime.frontend.engine_client import EngineDeadError
from pagoda.runtime.frontend.server.errors import bad_request
from pagoda.runtime.frontend.server.logprobs import ChoiceState, completion_logprobs
from pagoda.runtime.frontend.server.protocol import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
    random_id,
)
from pagoda.runtime.frontend.server.serving import (
    OpenAIServing,
    SSEResponse,
    merge_streams,
    sse,
    sse_error,
    sse_json,
)


class ServingCompletion(OpenAIServing):
    async def create(self, req: CompletionRequest, raw: Request):
        model = self.check_model(req.model)
        if req.suffix:
            raise bad_request("suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise bad_request("best_of must equal n (beam search is not supported)", param="best_of")
        prompts = await self._prompts(req.prompt)
        for _, ids in prompts:
            self.resolve_max_tokens(len(ids), req.max_tokens)
        prompt_logprobs = req.prompt_logprobs
        if req.echo and req.logprobs is not None and prompt_logprobs is None:
            prompt_logprobs = req.logprobs
        params = self.sampling_params(req, req.max_tokens, req.logprobs, prompt_logprobs, stream=bool(req.stream))
        request_id = random_id("cmpl")
        streams = await self.submit(request_id, prompts, params)
        if req.stream:
            return SSEResponse(self._stream(request_id, model, req, prompts, streams), streams)
        outputs = await self.wait_all(raw, streams)
        return self._response(request_id, model, req, prompts, outputs)

    async def _prompts(self, prompt) -> list[tuple[str | None, list[int]]]:
        if isinstance(prompt, str):
            return [(prompt, await self.renderer.encode(prompt))]
        if not prompt:
            raise bad_request("prompt must not be an empty list", param="prompt")
        if isinstance(prompt[0], int):
            self.check_token_ids(prompt)
            return [(None, list(prompt))]
        if isinstance(prompt[0], str):
            return list(zip(prompt, await self.renderer.encode_many(prompt), strict=True))
        for ids in prompt:
            self.check_token_ids(ids)
        return [(None, list(ids)) for ids in prompt]

    def _prompt_text(self, prompt: tuple[str | None, list[int]]) -> str:
        return prompt[0] if prompt[0] is not None else self.tokenizer.decode(prompt[1])

    def _response(self, request_id, model, req: CompletionRequest, prompts, outputs) -> CompletionResponse:
        choices, usage = [], UsageInfo()
        for i, out in enumerate(outputs):
            usage.prompt_tokens += len(out.prompt_token_ids)
            prompt_text = self._prompt_text(prompts[i]) if req.echo else ""
            for c in sorted(out.outputs, key=lambda c: c.index):
                usage.completion_tokens += len(c.token_ids)
                logprobs = None
                if req.logprobs is not None:
                    ids, lps = list(c.token_ids), list(c.logprobs or [])
                    if req.echo:
                        ids = list(out.prompt_token_ids) + ids
                        lps = list(out.prompt_logprobs or [None] * len(out.prompt_token_ids)) + lps
                    logprobs = completion_logprobs(self.tokenizer, ids, lps, req.logprobs)
                choices.append(CompletionChoice(index=i * req.n + c.index, text=prompt_text + c.text,
                                                logprobs=logprobs, finish_reason=c.finish_reason,
                                                stop_reason=c.stop_reason))
        usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
        return CompletionResponse(id=request_id, model=model, choices=choices, usage=usage)

    async def _stream(self, request_id, model, req: CompletionRequest, prompts, streams):
        """Each DELTA output holds only what is new; the frontend already held back what could
        still turn out to start a stop string."""
        created = int(time.time())
        states: dict[tuple[int, int], ChoiceState] = {}
        last: dict[int, object] = {}
        try:
            async for i, out in merge_streams(streams):
                last[i] = out
                choices = []
                for c in out.outputs:
                    state = states.setdefault((i, c.index), ChoiceState())
                    if state.done:
                        continue
                    choice = self._chunk_choice(req, prompts[i], out, c, state)
                    if choice is not None:
                        choice["index"] = i * req.n + c.index
                        choices.append(choice)
                if choices:
                    # CompletionResponse's JSON, built from dicts (see sse_json).
                    yield sse_json({"id": request_id, "object": "text_completion", "created": created,
                                    "model": model, "choices": choices, "usage": None,
                                    "system_fingerprint": None})
            if req.stream_options and req.stream_options.include_usage:
                usage = UsageInfo(
                    prompt_tokens=sum(len(o.prompt_token_ids) for o in last.values()),
                    completion_tokens=sum(state.num_tokens for state in states.values()))
                usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
                yield sse(CompletionResponse(id=request_id, created=created, model=model, choices=[],
                                             usage=usage))
        except (EngineDeadError, ValueError) as exc:
            yield sse_error(exc)
        yield "data: [DONE]\n\n"

    def _chunk_choice(self, req, prompt, out, c, state: ChoiceState):
        finished = c.finish_reason is not None
        text = c.text
        logprobs = None
        if req.logprobs is not None:
            ids, lps = list(c.token_ids), list(c.logprobs or [])
            if req.echo and not state.started:
                ids = list(out.prompt_token_ids) + ids
                lps = list(out.prompt_logprobs or [None] * len(out.prompt_token_ids)) + lps
            logprobs = completion_logprobs(self.tokenizer, ids, lps, req.logprobs, state.text_offset)
            state.text_offset += sum(len(t) for t in logprobs.tokens)
        state.num_tokens += len(c.token_ids)
        if req.echo and not state.started:
            text = self._prompt_text(prompt) + text
        if state.started and not text and not finished and not (logprobs and logprobs.tokens):
            return None
        state.started = True
        state.done = finished
        return {"index": c.index, "text": text, "logprobs": logprobs.model_dump() if logprobs else None,
                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
