"""/v1/embeddings through a real router to a real `pagoda serve --runner pooling` replica."""

from __future__ import annotations

import openai
import pytest
from router_support import REPLICA_FLAGS, ROOT, metric, router_process, write_static
from serve_process import pagoda_serve

from pagoda.runtime.tools.tiny_models import build_tiny_model, write_sentence_transformers


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("embedder")
    model = build_tiny_model(folder / "qwen2", "qwen2", seed=1)
    write_sentence_transformers(model, "mean_tokens", normalize=True)
    with pagoda_serve(model, "--runner", "pooling", "--served-model-name", "embedder", *REPLICA_FLAGS,
                      log_path=folder / "embedder.log", cwd=ROOT) as server:
        yield server


def test_embeddings_are_routed_by_model_and_match_a_direct_request(embedder, tmp_path):
    static = write_static(tmp_path / "models.yaml", [
        {"name": "embedder", "aliases": ["emb"], "endpoints": [embedder.url],
         "loadBalancing": {"strategy": "PrefixHash"}}])
    texts = ["def parse(text):", "import os"]
    direct = openai.OpenAI(base_url=f"{embedder.url}/v1", api_key="unused", max_retries=0)
    with router_process(static, log_path=tmp_path / "router.log") as router:
        sdk = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0, timeout=60)
        before = metric(embedder.url, "vllm:prompt_tokens")
        routed = sdk.embeddings.create(model="emb", input=texts)
        assert routed.model == "embedder"
        assert metric(embedder.url, "vllm:prompt_tokens") == before + routed.usage.prompt_tokens
        with pytest.raises(openai.NotFoundError):
            sdk.embeddings.create(model="nobody", input="x")
    reference = direct.embeddings.create(model="embedder", input=texts)
    assert [d.embedding for d in routed.data] == [d.embedding for d in reference.data]
