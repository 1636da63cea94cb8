"""LLM: offline batch inference, with vLLM's `LLM` interface so scripts can switch over."""

from __future__ import annotations

import contextlib
import gc
import itertools
from collections.abc import Iterator, Sequence

from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.frontend.llm_engine import LLMEngine
from pagoda.runtime.frontend.llm_pooling import PoolingMixin
from pagoda.runtime.frontend.outputs import RequestOutput
from pagoda.runtime.frontend.request_feed import RequestFeed
from pagoda.runtime.frontend.tokenizer import apply_chat_template
from pagoda.runtime.sampling_params import RequestOutputKind, SamplingParams


class LLM(PoolingMixin):
    """LLM(model, **engine_args): every keyword is an EngineArgs knob (pagoda.runtime.engine_args),
    with its default there; an unknown one is a TypeError that names the close matches.
    With runner="pooling", embed() and encode() make embeddings (frontend/llm_pooling.py)."""

    def __init__(self, model: str, **kwargs):
        args = EngineArgs(model=model, **{"usage_context": "llm_class", **kwargs})
        self.llm_engine = LLMEngine.from_engine_args(args)
        self._counter = itertools.count()

    def get_default_sampling_params(self) -> SamplingParams:
        """What a call without sampling_params uses: the model's generation_config.json defaults
        (see --generation-config), else SamplingParams()."""
        return SamplingParams(**self.llm_engine.generation_defaults)

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def shutdown(self) -> None:
        """Stop tensor-parallel worker processes now (they also stop when the LLM is dropped)."""
        self.llm_engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def generate(
        self,
        prompts: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        prompt_token_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[RequestOutput]:
        self._check_generating("generate")
        texts, token_ids = self._normalize_prompts(prompts, prompt_token_ids)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(token_ids)
        else:
            params = list(sampling_params)
            if len(params) != len(token_ids):
                raise ValueError(f"got {len(params)} sampling_params for {len(token_ids)} prompts")
        return self._run(texts, token_ids, params, use_tqdm)

    def chat(
        self,
        messages,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"} dicts) or a list of them."""
        self._check_generating("chat")
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        tokenizer = self.get_tokenizer()
        texts = [
            apply_chat_template(tokenizer, c, chat_template, add_generation_prompt) for c in conversations
        ]
        # The template already holds any BOS token; the tokenizer must not add another.
        ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
        params = sampling_params or self.get_default_sampling_params()
        params = [params] * len(ids) if isinstance(params, SamplingParams) else list(params)
        return self._run(texts, ids, params, use_tqdm)

    def _normalize_prompts(self, prompts, prompt_token_ids) -> tuple[list[str | None], list[list[int]]]:
        if prompt_token_ids is not None:
            ids = [list(p) for p in prompt_token_ids]
            return [None] * len(ids), ids
        if prompts is None:
            raise ValueError("give prompts or prompt_token_ids")
        if isinstance(prompts, str):
            prompts = [prompts]
        elif prompts and isinstance(prompts[0], int):
            prompts = [prompts]
        tokenizer = self.get_tokenizer()
        texts, ids = [], []
        for p in prompts:
            if isinstance(p, str):
                texts.append(p)
                ids.append(tokenizer.encode(p))
            elif isinstance(p, dict) and "prompt_token_ids" in p:
                texts.append(p.get("prompt"))
                ids.append(list(p["prompt_token_ids"]))
            else:
                texts.append(None)
                ids.append(list(p))
        return texts, ids

    def _run(self, texts, token_ids, params, use_tqdm: bool) -> list[RequestOutput]:
        with frozen_heap():
            return self._generate(texts, token_ids, params, use_tqdm)

    def _generate(self, texts, token_ids, params, use_tqdm: bool) -> list[RequestOutput]:
        engine = self.llm_engine
        order = {}
        final_only: dict[int, SamplingParams] = {}  # only finished outputs are read here

        def add(item) -> int:
            text, ids, p = item
            request_id = str(next(self._counter))
            if p.output_kind != RequestOutputKind.FINAL_ONLY:
                p = final_only.get(id(p)) or final_only.setdefault(
                    id(p), p.clone(output_kind=RequestOutputKind.FINAL_ONLY))
            engine.add_request(request_id, text, ids, p)
            order[request_id] = len(order)
            return len(ids)

        # The requests go in a few steps ahead of the scheduler, not all before the first step
        # (request_feed.py says why).
        core = engine.engine_core
        feed = RequestFeed(zip(texts, token_ids, params), add, core.scheduler.waiting, core.max_num_batched_tokens)
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(token_ids), desc="Processed prompts", dynamic_ncols=True)
        finished: dict[str, RequestOutput] = {}
        try:
            feed.top_up()
            while not feed.done or engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished and out.request_id in order:
                        finished[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
                feed.top_up()
        except BaseException:
            # A prompt that fails validation late in the list (or an interrupt) ends the call: the
            # requests it added leave the engine, so none runs on unseen into the next call.
            engine.abort_request([r for r in order if r not in finished])
            if feed.failed:  # the engine is sound: read the step in flight, whose rows are dropped
                while engine.has_unfinished_requests():
                    engine.step()
            raise
        finally:
            if bar is not None:
                bar.close()
        return sorted(finished.values(), key=lambda o: order[o.request_id])


YOUNG_THRESHOLD = 20000  # tracked allocations between young collections while generating (default 700)


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """The collector while a generate call runs. What exists before it (the model, torch, the
    engine) is kept out of its walks (gc.freeze), and handed back after; full collections wait
    (they would walk every request's token lists too), and young ones run every 20k allocations
    instead of 700 (most of a step's records are gone by then). Measured in W4 at 1,024 seats on
    the CPU: 0.3 s of collections in a run, one of them 170 ms on the step thread (the GPU waits
    that long), down to 25 ms. vLLM's engine core freezes its heap likewise; so does engine_proc."""
    if gc.get_freeze_count():  # frozen by someone else already: leave it to them
        yield
        return
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(threshold[0], YOUNG_THRESHOLD), threshold[1], max(threshold[2], 100))
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()
