"""API keys: an empty key is refused at start-up (it used to switch authentication off), and a key
matches as its UTF-8 bytes, so non-ASCII keys work."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from pagoda.runtime.frontend.server.api_keys import bearer_token, key_matches, load_api_keys

from .live import MODEL, LiveServer

KEY = "clé-ключ-🔑"


@pytest.mark.parametrize(("flags", "env"), [
    (["--api-key", ""], {}),
    (["--api-key", "   "], {}),
    ([], {"PAGODA_API_KEY": ""}),  # a manifest whose secret is empty
    (["--api-key", " padded "], {}),
])
def test_blank_api_key_is_refused_at_start_up(tiny_dir, flags, env):
    cmd = [sys.executable, "-m", "pagoda.runtime.cli", "serve", tiny_dir, "--device", "cpu", "--port", "1", *flags]
    proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "API key" in proc.stderr


@pytest.fixture(scope="module")
def keyed(tiny_dir):
    s = LiveServer(tiny_dir, max_model_len=64, api_key=KEY)
    yield s
    s.close()


def test_non_ascii_key_matches(keyed):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    good = {"authorization": b"Bearer " + KEY.encode()}
    resp = httpx.post(keyed.v1 + "/completions", json=body, headers=good, timeout=60)
    assert resp.status_code == 200, resp.text
    assert httpx.get(keyed.v1 + "/models", headers={"authorization": b"bearer  " + KEY.encode()}).status_code == 200
    # The mojibake is what a latin-1 decode of the header followed by a UTF-8 encode makes.
    mojibake = KEY.encode().decode("latin-1").encode()
    for wrong in (b"Bearer " + KEY.encode()[:-1], b"Bearer " + mojibake, b"Bearer cl\xe9", b"", KEY.encode()):
        resp = httpx.post(keyed.v1 + "/completions", json=body, headers={"authorization": wrong}, timeout=60)
        assert resp.status_code == 401, wrong
        assert resp.json()["error"]["code"] == "invalid_api_key"


def test_any_of_several_keys_matches():
    keys = load_api_keys(["first", KEY])
    assert key_matches(bearer_token(b"Bearer first"), keys)
    assert key_matches(bearer_token(b"Bearer " + KEY.encode()), keys)
    assert not key_matches(bearer_token(b"Bearer firs"), keys)
    assert not key_matches(bearer_token(b"Basic first"), keys)
    assert load_api_keys(None) is None and load_api_keys([]) is None
