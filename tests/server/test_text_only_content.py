"""An image-text checkpoint (Gemma3ForConditionalGeneration) behind the real server: text chat is
served through its chat template; an image, audio or file part is a 400 in OpenAI's shape that
names the part (messages[i].content[j]) and says the server serves text only, on every route
that takes chat messages. Before, the part failed the text part's schema ("Input should be 'text'")."""

from __future__ import annotations

import httpx
import openai
import pytest

from pagoda.runtime.tools.tiny_models import build_tiny_model

from .live import MODEL, LiveServer

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


@pytest.fixture(scope="module")
def vlm_server(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("vlm") / "gemma3_vlm", "gemma3_vlm")
    s = LiveServer(path, max_model_len=128)
    yield s
    s.close()


@pytest.fixture(scope="module")
def oai(vlm_server):
    return openai.OpenAI(base_url=vlm_server.v1, api_key="unused", max_retries=0)


def test_text_chat_is_served(oai):
    out = oai.chat.completions.create(model=MODEL, max_tokens=4, temperature=0,
                                      messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert out.usage.completion_tokens >= 1 and out.choices[0].message.role == "assistant"


def test_an_image_part_is_a_400_naming_it(oai):
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "what is this?"}, IMAGE]}]
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model=MODEL, max_tokens=4, messages=messages)
    body = info.value.body
    assert body["param"] == "messages[1].content[1]" and body["type"] == "invalid_request_error", body
    assert "'image_url'" in body["message"] and "text only" in body["message"], body


@pytest.mark.parametrize("route", ["/tokenize", "/v1/chat/completions"])
@pytest.mark.parametrize("part", [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
                                  {"type": "file", "file": {"file_id": "f"}}])
def test_other_media_parts_are_400s_on_every_chat_route(vlm_server, route, part):
    r = httpx.post(vlm_server.base_url + route, json={"model": MODEL, "messages": [{"role": "user", "content": [part]}]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages[0].content[0]" and "text only" in error["message"], error
