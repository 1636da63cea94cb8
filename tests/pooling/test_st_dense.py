"""Sentence-transformers checkpoints with Dense projections after the pooling, saved by the
sentence-transformers library itself (6.x module paths, its `pooling_mode` config), embedded by
Pagoda and by sentence-transformers' own module chain: the vectors agree in float32."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch
from server.live import MODEL, LiveServer

from pagoda.runtime import LLM
from pagoda.runtime.pooling_config import pooler_config_for
from pagoda.runtime.tools.tiny_models import build_tiny_model

TOL = 2e-5
TEXTS = ["def parse(text):", "import os", "a much longer input, which spans several KV blocks of the cache"]


def save_st(root, family: str, pooling: str, dense: list, normalize: bool) -> str:
    from sentence_transformers import SentenceTransformer, models

    base = build_tiny_model(root / family, family, seed=5)
    torch.manual_seed(0)
    modules = [models.Transformer(str(base))]
    modules.append(models.Pooling(modules[0].get_embedding_dimension(), pooling_mode=pooling))
    modules += [models.Dense(**layer) for layer in dense]
    if normalize:
        modules.append(models.Normalize())
    out = root / "saved"
    SentenceTransformer(modules=modules, device="cpu").save(str(out))
    return str(out)


@pytest.fixture(scope="module")
def two_dense(tmp_path_factory) -> str:
    """mean pooling, 64 -> 32 (tanh, bias) -> 16 (identity, no bias), normalized."""
    return save_st(tmp_path_factory.mktemp("two_dense"), "qwen2", "mean", [
        dict(in_features=64, out_features=32, activation_function=torch.nn.Tanh()),
        dict(in_features=32, out_features=16, bias=False, activation_function=torch.nn.Identity())], True)


@pytest.fixture(scope="module")
def residual_dense(tmp_path_factory) -> str:
    """last-token pooling, one 64 -> 48 GELU projection with a projected residual, not normalized."""
    return save_st(tmp_path_factory.mktemp("residual"), "llama", "lasttoken", [
        dict(in_features=64, out_features=48, activation_function=torch.nn.GELU(), use_residual=True)], False)


def reference(path: str) -> torch.Tensor:
    """The saved checkpoint reloaded by sentence-transformers, its module chain run on the token ids
    that `input` text gets. (Its own encode() wraps text in the chat template first when the
    tokenizer has one, as sentence-transformers 6 does for decoders; /v1/embeddings' `input`, in
    vLLM and Pagoda, is tokenized as it is.)"""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    model = SentenceTransformer(path, device="cpu").eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    rows = []
    with torch.no_grad():
        for text in TEXTS:
            ids = torch.tensor([tokenizer(text).input_ids])
            rows.append(model.forward({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
                        ["sentence_embedding"][0])
    return torch.stack(rows)


@pytest.mark.parametrize("fixture,pooling,normalize,size", [("two_dense", "MEAN", True, 16),
                                                            ("residual_dense", "LAST", False, 48)])
def test_embeddings_equal_sentence_transformers(request, fixture, pooling, normalize, size):
    path = request.getfixturevalue(fixture)
    config = pooler_config_for("auto", Path(path), "X")
    assert (config.pooling_type, config.normalize, config.dimension) == (pooling, normalize, size)
    llm = LLM(path, runner="auto", device="cpu", dtype="float32", block_size=8)
    got = torch.tensor([o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)])
    expected = reference(path)
    assert got.shape == expected.shape == (len(TEXTS), size)
    assert torch.allclose(got, expected, atol=TOL, rtol=0), (got - expected).abs().max()


def test_the_server_serves_the_projected_size_and_bounds_dimensions_by_it(two_dense):
    server = LiveServer(two_dense, dtype="float32", max_model_len=64)
    try:
        reply = httpx.post(f"{server.v1}/embeddings", json={"model": MODEL, "input": TEXTS, "encoding_format": "float"})
        assert reply.status_code == 200, reply.text
        got = torch.tensor([d["embedding"] for d in reply.json()["data"]])
        assert torch.allclose(got, reference(two_dense), atol=TOL, rtol=0)
        bad = httpx.post(f"{server.v1}/embeddings", json={"model": MODEL, "input": "x", "dimensions": 32})
        # no matryoshka config: refused as vLLM refuses it, before the size check
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "dimensions"
    finally:
        server.close()
