"""Invalid Unicode anywhere a string reaches the model is a 400 naming the field, never a 500, and
the connection stays usable: lone surrogates escaped in JSON, and raw bytes that are not UTF-8
(which json.loads cannot even decode)."""

from __future__ import annotations

import httpx
import pytest

from .test_errors import assert_error_shape

USER = b'{"role": "user", "content": %s}'
CASES = [
    ("/v1/completions", b'{"model": "tiny", "max_tokens": 2, "prompt": %s}', "prompt"),
    ("/v1/completions", b'{"model": "tiny", "max_tokens": 2, "prompt": ["fine", %s]}', "prompt"),
    ("/v1/completions", b'{"model": "tiny", "max_tokens": 2, "prompt": "hi", "stop": [%s]}', "stop"),
    ("/v1/completions", b'{"model": "tiny", "max_tokens": 2, "prompt": "hi", "logit_bias": {%s: 1}}',
     "logit_bias"),
    ("/v1/completions", b'{"model": %s, "max_tokens": 2, "prompt": "hi"}', "model"),
    ("/v1/chat/completions", b'{"model": "tiny", "max_tokens": 2, "messages": [' + USER + b"]}", "messages"),
    ("/v1/chat/completions", b'{"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", '
     b'"content": [{"type": "text", "text": %s}]}]}', "messages"),
    ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "a", "name": %s}]}',
     "messages"),
    ("/tokenize", b'{"prompt": %s}', "prompt"),
    ("/tokenize", b'{"messages": [' + USER + b"]}", "messages"),
]
BAD_STRINGS = {
    "lone high surrogate": b'"a\\ud800b"',
    "lone low surrogate": b'"\\udfff"',
    "reversed pair": b'"\\ude00\\ud83d"',
    "invalid utf-8 byte": b'"ab\xffcd"',
    "truncated utf-8": b'"\xe2\x82"',
    "utf-8 encoded surrogate": b'"\xed\xa0\x80"',
    "overlong encoding": b'"\xc0\xaf"',
}


@pytest.mark.parametrize(("path", "template", "param"), CASES)
@pytest.mark.parametrize("bad", list(BAD_STRINGS), ids=list(BAD_STRINGS))
def test_invalid_unicode_is_400_naming_the_field(server, path, template, param, bad):
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        resp = http.post(path, content=template % BAD_STRINGS[bad], headers={"content-type": "application/json"})
        err = assert_error_shape(resp, 400)
        assert (err["param"], err["code"]) == (param, "invalid_unicode"), err
        # Same connection, next request: nothing was reset.
        assert http.get("/health").status_code == 200


def test_valid_unicode_still_works(server):
    """Escaped surrogate pairs are one valid character; non-ASCII text is fine."""
    for prompt in (b'"\\ud83d\\ude00 caf\\u00e9"', '"😀 café €"'.encode()):
        resp = httpx.post(server.base_url + "/tokenize", content=b'{"prompt": %s}' % prompt,
                          headers={"content-type": "application/json"}, timeout=60)
        assert resp.status_code == 200 and resp.json()["count"] > 0, resp.text
