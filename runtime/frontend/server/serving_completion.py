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
    random_id,
)
from pagoda.runtime.frontend.server.request_options import prompt_logprobs_json, usage
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
        if req.max_tokens == 0 and not req.echo:
            raise bad_request("max_tokens must be at least 1 (0 only scores the prompt, with echo)",
                              param="max_tokens")
        prompts = await self._prompts(req)
        # Scoring the prompt still runs the engine for one token, which nobody sees (as vLLM does).
        max_tokens = 1 if req.scores_prompt else req.max_tokens
        for _, ids in prompts:
            self.resolve_max_tokens(len(ids), max_tokens)
        prompt_logprobs = req.prompt_logprobs
        if req.echo and req.logprobs is not None and prompt_logprobs is None:
            prompt_logprobs = req.logprobs
        logprobs = None if req.scores_prompt else req.logprobs
        params = self.sampling_params(req, max_tokens, logprobs, prompt_logprobs, stream=bool(req.stream))
        request_id = random_id("cmpl")
        streams = await self.submit(request_id, prompts, params)
        if req.stream:
            return SSEResponse(self._stream(request_id, model, req, prompts, streams), streams)
        outputs = await self.wait_all(raw, streams)
        return self._response(request_id, model, req, prompts, outputs)

    async def _prompts(self, req: CompletionRequest) -> list[tuple[str | None, list[int]]]:
        """(text, ids) of each prompt, truncated as asked; a truncated prompt's text is its kept ids'."""
        prompt = req.prompt
        if isinstance(prompt, str):
            prompts = [(prompt, await self.renderer.encode(prompt, req.add_special_tokens))]
        elif not prompt:
            raise bad_request("prompt must not be an empty list", param="prompt")
        elif isinstance(prompt[0], int):
            self.check_token_ids(prompt)
            prompts = [(None, list(prompt))]
        elif isinstance(prompt[0], str):
            prompts = list(zip(prompt, await self.renderer.encode_many(prompt, req.add_special_tokens), strict=True))
        else:
            for ids in prompt:
                self.check_token_ids(ids)
            prompts = [(None, list(ids)) for ids in prompt]
        out = []
        for text, ids in prompts:
            kept = self.truncate(req, ids)
            out.append((text if len(kept) == len(ids) else None, kept))
        return out

    def _prompt_text(self, prompt: tuple[str | None, list[int]]) -> str:
        return prompt[0] if prompt[0] is not None else self.tokenizer.decode(prompt[1])

    def _echoed(self, req: CompletionRequest, prompt, out, c, first: bool):
        """(text, token ids, logprobs) a choice shows: the prompt in front under echo (on a stream,
        in its first chunk), or the prompt alone when scoring it."""
        ids, lps, text = list(c.token_ids), list(c.logprobs or []), c.text
        if req.scores_prompt:
            ids, lps, text = [], [], ""
        if req.echo and first:
            prompt_ids = list(out.prompt_token_ids)
            ids = prompt_ids + ids
            lps = list(out.prompt_logprobs or [None] * len(prompt_ids)) + lps
            text = self._prompt_text(prompt) + text
        return text, ids, lps

    def _response(self, request_id, model, req: CompletionRequest, prompts, outputs) -> CompletionResponse:
        choices, num_prompt, num_completion = [], 0, 0
        as_ids = bool(req.return_tokens_as_token_ids)
        for i, out in enumerate(outputs):
            num_prompt += len(out.prompt_token_ids)
            prompt_logprobs = prompt_logprobs_json(out.prompt_logprobs)
            for c in sorted(out.outputs, key=lambda c: c.index):
                text, ids, lps = self._echoed(req, prompts[i], out, c, first=True)
                if not req.scores_prompt:
                    num_completion += len(c.token_ids)
                logprobs = None
                if req.logprobs is not None:
                    logprobs = completion_logprobs(self.tokenizer, ids, lps, req.logprobs, as_token_ids=as_ids)
                choices.append(CompletionChoice(index=i * req.n + c.index, text=text, logprobs=logprobs,
                                                finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                                                prompt_logprobs=prompt_logprobs))
        return CompletionResponse(id=request_id, model=model, choices=choices, usage=usage(num_prompt, num_completion))

    async def _stream(self, request_id, model, req: CompletionRequest, prompts, streams):
        """Each DELTA output holds only what is new; the frontend already held back what could
        still turn out to start a stop string. With stream_options.continuous_usage_stats (and
        include_usage, as vLLM has it) every chunk carries the usage so far of its prompt."""
        created = int(time.time())
        states: dict[tuple[int, int], ChoiceState] = {}
        last: dict[int, object] = {}
        options = req.stream_options
        include_usage = bool(options and options.include_usage)
        continuous = include_usage and bool(options.continuous_usage_stats)
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
                    chunk_usage = None
                    if continuous:
                        done = sum(st.num_tokens for (j, _), st in states.items() if j == i)
                        chunk_usage = usage(len(out.prompt_token_ids), done).model_dump()
                    # CompletionResponse's JSON, built from dicts (see sse_json).
                    yield sse_json({"id": request_id, "object": "text_completion", "created": created,
                                    "model": model, "choices": choices, "usage": chunk_usage,
                                    "system_fingerprint": None})
            if include_usage:
                total = usage(sum(len(o.prompt_token_ids) for o in last.values()),
                              sum(state.num_tokens for state in states.values()))
                yield sse(CompletionResponse(id=request_id, created=created, model=model, choices=[], usage=total))
        except (EngineDeadError, ValueError) as exc:
            yield sse_error(exc)
        yield "data: [DONE]\n\n"

    def _chunk_choice(self, req, prompt, out, c, state: ChoiceState):
        finished = c.finish_reason is not None
        text, ids, lps = self._echoed(req, prompt, out, c, first=not state.started)
        logprobs = None
        if req.logprobs is not None:
            logprobs = completion_logprobs(self.tokenizer, ids, lps, req.logprobs, state.text_offset,
                                           as_token_ids=bool(req.return_tokens_as_token_ids))
            state.text_offset += sum(len(t) for t in logprobs.tokens)
        if not req.scores_prompt:
            state.num_tokens += len(c.token_ids)
        if state.started and not text and not finished and not (logprobs and logprobs.tokens):
            return None
        state.started = True
        state.done = finished
        return {"index": c.index, "text": text, "logprobs": logprobs.model_dump() if logprobs else None,
                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason, "prompt_logprobs": None}
