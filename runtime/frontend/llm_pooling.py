"""LLM.embed and LLM.encode: offline embeddings with the pooling runner, as vLLM's LLM has them.

    llm = LLM("path/to/embedding-model", runner="pooling")
    [out] = llm.embed(["a sentence"])
    out.outputs.embedding  # list of floats, L2-normalized unless the model's pooler says otherwise
"""

from __future__ import annotations

from collections.abc import Sequence

from pagoda.runtime.frontend.pooling_outputs import EmbeddingRequestOutput, PoolingRequestOutput
from pagoda.runtime.pooling_params import PoolingParams


class PoolingMixin:
    def encode(
        self,
        prompts: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]] | None = None,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = True,
        prompt_token_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[PoolingRequestOutput]:
        """One PoolingRequestOutput per prompt, in order; outputs.data is a float32 tensor."""
        self._check_pooling("encode")
        texts, token_ids = self._normalize_prompts(prompts, prompt_token_ids)
        if pooling_params is None:
            pooling_params = PoolingParams()
        params = [pooling_params] * len(token_ids) if isinstance(pooling_params, PoolingParams) else list(pooling_params)
        if len(params) != len(token_ids):
            raise ValueError(f"got {len(params)} pooling_params for {len(token_ids)} prompts")
        if truncate_prompt_tokens is not None:
            params = [PoolingParams(p.dimensions, p.normalize, truncate_prompt_tokens) for p in params]
        token_ids = [self._truncate(ids, p) for ids, p in zip(token_ids, params)]
        return self._run(texts, token_ids, params, use_tqdm)

    def embed(
        self,
        prompts: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]] | None = None,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = True,
        prompt_token_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[EmbeddingRequestOutput]:
        """One EmbeddingRequestOutput per prompt, in order; outputs.embedding is a list of floats."""
        self._check_pooling("embed")
        outputs = self.encode(prompts, pooling_params, truncate_prompt_tokens=truncate_prompt_tokens,
                              use_tqdm=use_tqdm, prompt_token_ids=prompt_token_ids)
        return [EmbeddingRequestOutput.from_base(o) for o in outputs]

    def _check_pooling(self, method: str) -> None:
        if self.llm_engine.pooler_config is None:
            raise ValueError(f"LLM.{method}() needs the pooling runner: LLM(model, runner='pooling')")

    def _check_generating(self, method: str) -> None:
        if self.llm_engine.pooler_config is not None:
            raise ValueError(f"LLM.{method}() is for generative models; this LLM runs the pooling runner "
                             "(use LLM.embed or LLM.encode)")

    def _truncate(self, ids: list[int], params: PoolingParams) -> list[int]:
        from pagoda.runtime.frontend.pooling_processor import truncate_prompt

        return truncate_prompt(ids, params.truncate_prompt_tokens, self.llm_engine.model_config.max_model_len)
