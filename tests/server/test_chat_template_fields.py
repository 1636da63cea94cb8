"""vLLM's chat-template request fields through the real openai client, checked against transformers'
own apply_chat_template and tokenizer: chat_template_kwargs (enable_thinking), documents, a
per-request chat_template (only with --trust-request-chat-template), add_special_tokens on chat
and completions, and /tokenize's chat fields and return_token_strs."""

from __future__ import annotations

import httpx
import openai
import pytest

from pagoda.runtime.tools.tiny_models import build_tiny_model

from .live import MODEL, LiveServer
from .test_errors import assert_error_shape

# Qwen3's switch, in miniature: enable_thinking=false writes an empty think block after the
# generation prompt; documents are listed after the turns.
TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% for d in documents or [] %}{{ '<|im_start|>document\\n' + d['title'] + ': ' + d['text'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
    "{% endif %}"
)
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def parse(text):"}]
DOCUMENTS = [{"title": "os", "text": "operating system interfaces"}, {"title": "re", "text": "regexes"}]


@pytest.fixture(scope="module")
def bos_model(tmp_path_factory) -> str:
    """A tiny model whose tokenizer adds a BOS token (as Llama's does) and whose template reads
    enable_thinking and documents."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    path = build_tiny_model(tmp_path_factory.mktemp("bos") / "llama", "llama")
    tok = AutoTokenizer.from_pretrained(path)
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A $B", special_tokens=[("<|bos|>", tok.bos_token_id)])
    tok.chat_template = TEMPLATE
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def hf_tok(bos_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(bos_model)
    assert tok("hi").input_ids[0] == tok.bos_token_id  # the fixture's premise
    return tok


@pytest.fixture(scope="module")
def trusting(bos_model):
    s = LiveServer(bos_model, max_model_len=256, server_config={"trust_request_chat_template": True})
    yield s
    s.close()


@pytest.fixture(scope="module")
def oai(trusting):
    return openai.OpenAI(base_url=trusting.v1, api_key="unused", max_retries=0)


def reference(tok, messages=MESSAGES, add_special_tokens=False, **template_kwargs) -> list[int]:
    template_kwargs.setdefault("add_generation_prompt", True)
    text = tok.apply_chat_template(messages, tokenize=False, **template_kwargs)
    return tok(text, add_special_tokens=add_special_tokens).input_ids


def tokenize(server, **body) -> dict:
    reply = httpx.post(server.base_url + "/tokenize", json={"model": MODEL, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()


def chat_prompt_tokens(oai, **extra) -> int:
    out = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1, extra_body=extra)
    return out.usage.prompt_tokens


def test_chat_template_kwargs_reach_the_template(trusting, oai, hf_tok):
    default, thinking_off = reference(hf_tok), reference(hf_tok, enable_thinking=False)
    assert thinking_off != default  # the switch changes the prompt, so the test can tell
    for kwargs, ids in (({}, default), ({"enable_thinking": True}, default), ({"enable_thinking": False}, thinking_off)):
        assert chat_prompt_tokens(oai, chat_template_kwargs=kwargs) == len(ids)
        assert tokenize(trusting, messages=MESSAGES, chat_template_kwargs=kwargs)["tokens"] == ids
    # They may override the request's own template arguments, as vLLM merges them.
    no_prompt = reference(hf_tok, add_generation_prompt=False)
    assert tokenize(trusting, messages=MESSAGES, chat_template_kwargs={"add_generation_prompt": False})["tokens"] \
        == no_prompt
    assert chat_prompt_tokens(oai, chat_template_kwargs={"add_generation_prompt": False}) == len(no_prompt)


def test_documents_reach_the_template(trusting, oai, hf_tok):
    ids = reference(hf_tok, documents=DOCUMENTS)
    assert ids != reference(hf_tok)
    assert chat_prompt_tokens(oai, documents=DOCUMENTS) == len(ids)
    assert tokenize(trusting, messages=MESSAGES, documents=DOCUMENTS)["tokens"] == ids


def test_a_request_template_replaces_the_servers_when_trusted(trusting, oai, hf_tok):
    mine = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
    ids = reference(hf_tok, chat_template=mine)
    assert ids != reference(hf_tok)
    assert chat_prompt_tokens(oai, chat_template=mine) == len(ids)
    assert tokenize(trusting, messages=MESSAGES, chat_template=mine)["tokens"] == ids
    assert tokenize(trusting, messages=MESSAGES, chat_template_kwargs={"chat_template": mine})["tokens"] == ids
    with pytest.raises(openai.BadRequestError) as info:
        chat_prompt_tokens(oai, chat_template="{% for %}")
    assert info.value.body["param"] == "chat_template" and "chat template" in info.value.body["message"]


def test_a_request_template_is_refused_unless_trusted(server):
    oai = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)
    for extra in ({"chat_template": "{{ 'x' }}"}, {"chat_template_kwargs": {"chat_template": "{{ 'x' }}"}}):
        with pytest.raises(openai.BadRequestError) as info:
            chat_prompt_tokens(oai, **extra)
        assert info.value.body["param"] == "chat_template"
        assert "--trust-request-chat-template" in info.value.body["message"]
        err = assert_error_shape(httpx.post(server.base_url + "/tokenize", json={"messages": MESSAGES, **extra}), 400)
        assert err["param"] == "chat_template"


@pytest.mark.parametrize("kwargs", [{"tokenize": True}, {"return_dict": True}, {"add_generation_prompt": "yes"}])
def test_chat_template_kwargs_may_not_steer_the_machinery(oai, kwargs):
    with pytest.raises(openai.BadRequestError) as info:
        chat_prompt_tokens(oai, chat_template_kwargs=kwargs)
    assert info.value.body["param"] == "chat_template_kwargs"
    assert next(iter(kwargs)) in info.value.body["message"]


def test_add_special_tokens_on_completions(trusting, oai, hf_tok):
    text = "import os"

    def prompt_ids(**extra) -> list[int]:
        out = oai.completions.create(model=MODEL, prompt=text, max_tokens=1,
                                     extra_body={"prompt_logprobs": 0, **extra})
        # prompt_logprobs holds, for each prompt token after the first, a dict keyed by its id.
        (choice,) = out.choices
        rest = [int(next(iter(d))) for d in choice.model_extra["prompt_logprobs"][1:]]
        assert out.usage.prompt_tokens == len(rest) + 1
        return rest

    with_bos, without = hf_tok(text).input_ids, hf_tok(text, add_special_tokens=False).input_ids
    assert with_bos == [hf_tok.bos_token_id, *without]
    assert prompt_ids() == with_bos[1:]
    assert prompt_ids(add_special_tokens=True) == with_bos[1:]
    assert prompt_ids(add_special_tokens=False) == without[1:]
    assert tokenize(trusting, prompt=text)["tokens"] == with_bos
    assert tokenize(trusting, prompt=text, add_special_tokens=False)["tokens"] == without


def test_add_special_tokens_on_chat(trusting, oai, hf_tok):
    plain, extra = reference(hf_tok), reference(hf_tok, add_special_tokens=True)
    assert extra == [hf_tok.bos_token_id, *plain]
    assert chat_prompt_tokens(oai) == chat_prompt_tokens(oai, add_special_tokens=False) == len(plain)
    assert chat_prompt_tokens(oai, add_special_tokens=True) == len(extra)
    assert tokenize(trusting, messages=MESSAGES)["tokens"] == plain
    assert tokenize(trusting, messages=MESSAGES, add_special_tokens=True)["tokens"] == extra


def test_tokenize_returns_token_strings(trusting, hf_tok):
    out = tokenize(trusting, prompt="def parse(text):", return_token_strs=True)
    assert out["token_strs"] == hf_tok.convert_ids_to_tokens(out["tokens"])
    assert tokenize(trusting, prompt="def")["token_strs"] is None


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/tokenize", {"prompt": "hi", "frobnicate": 1}, "frobnicate"),
    ("/tokenize", {"messages": MESSAGES, "temprature": 0}, "temprature"),
    ("/tokenize", {"prompt": "hi", "priority": 0}, "priority"),
    ("/tokenize", {"prompt": "hi", "documents": DOCUMENTS}, "documents"),
    ("/tokenize", {"prompt": "hi", "chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs"),
    ("/detokenize", {"tokens": [1, 2], "frobnicate": 1}, "frobnicate"),
    ("/detokenize", {"tokens": [1, 2], "skip_special_tokens": True}, "skip_special_tokens"),
])
def test_tokenizer_routes_refuse_fields_they_do_not_take(server, path, body, param):
    err = assert_error_shape(httpx.post(server.base_url + path, json={"model": MODEL, **body}), 400)
    assert err["param"] == param
