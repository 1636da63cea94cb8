"""GET /v1/models/{id} with the real `openai` SDK (404 in OpenAI's shape for a model not served), and
GET /tokenizer_info as vLLM serves it: off unless asked for, behind the API key, and equal to what
transformers loads from the checkpoint's tokenizer files."""

from __future__ import annotations

import httpx
import openai
import pytest

from .live import MODEL, LiveServer


@pytest.fixture(scope="module")
def info_server(tiny_dir):
    s = LiveServer(tiny_dir, max_model_len=128, api_key="sk-info",
                   server_config={"enable_tokenizer_info_endpoint": True})
    yield s
    s.close()


def test_retrieve_model_and_404_for_others(server):
    oai = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)
    card = oai.models.retrieve(MODEL)
    assert card.id == MODEL and card.object == "model"
    assert card.model_dump() == next(c for c in oai.models.list().data if c.id == MODEL).model_dump()
    with pytest.raises(openai.NotFoundError) as info:
        oai.models.retrieve("gpt-4o")
    body = info.value.body
    assert body["code"] == "model_not_found" and body["param"] == "model" and "gpt-4o" in body["message"]
    assert info.value.response.json()["error"]["type"] == "not_found_error"


def test_tokenizer_info_is_off_by_default(server):
    resp = httpx.get(server.base_url + "/tokenizer_info")
    assert resp.status_code == 404 and "error" in resp.json()


def test_tokenizer_info_matches_the_checkpoint(info_server, tiny_dir):
    from transformers import AutoTokenizer

    assert httpx.get(info_server.base_url + "/tokenizer_info").status_code == 401
    resp = httpx.get(info_server.base_url + "/tokenizer_info", headers={"Authorization": "Bearer sk-info"})
    assert resp.status_code == 200
    info, tok = resp.json(), AutoTokenizer.from_pretrained(tiny_dir)
    assert info["tokenizer_class"] == type(tok).__name__
    assert info["chat_template"] == tok.chat_template
    assert info["model_max_length"] == tok.model_max_length
    for name in ("bos_token", "eos_token", "pad_token"):
        assert info[name] == getattr(tok, name)
    assert not any(key.endswith("_file") for key in info)
