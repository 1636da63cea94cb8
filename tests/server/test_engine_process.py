"""The engine process's life: a failed load stops the server from starting with the reason, a crash
turns every request and /health into 503, and the process never outlives the server."""

from __future__ import annotations

import json
import logging
import shutil
import signal

import httpx
import openai
import pytest

from pagoda.runtime.cli import build_parser
from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.frontend.process_engine import EngineStartError, ProcessEngine
from pagoda.runtime.frontend.server.cli import run

from .live import MODEL, LiveServer


@pytest.fixture(scope="module")
def broken_dir(tiny_dir, tmp_path_factory):
    """A checkpoint whose config names an architecture nobody knows."""
    path = tmp_path_factory.mktemp("broken") / "model"
    shutil.copytree(tiny_dir, path)
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["NoSuchForCausalLM"]
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_a_failed_load_is_a_clear_start_up_error(broken_dir, caplog):
    with pytest.raises(EngineStartError, match="NoSuchForCausalLM"):
        ProcessEngine.from_engine_args(EngineArgs(str(broken_dir), device="cpu"), log_level="critical")
    # `pagoda serve` says why and exits 1 instead of serving a dead engine.
    args = build_parser("serve").parse_args(["serve", str(broken_dir), "--device", "cpu",
                                             "--log-level", "critical"])
    with caplog.at_level(logging.ERROR, logger="pagoda.server"):
        assert run(args) == 1
    assert "NoSuchForCausalLM" in caplog.text


def test_engine_process_crash_is_503_and_the_process_ends_with_the_server(tiny_dir):
    s = LiveServer(tiny_dir, max_model_len=64, engine_mode="process")
    try:
        client = openai.OpenAI(base_url=s.v1, api_key="x", max_retries=0)
        assert client.completions.create(model=MODEL, prompt="hi", max_tokens=2).choices
        assert httpx.get(s.base_url + "/health").status_code == 200
        s.client.proc.send_signal(signal.SIGKILL)  # the engine dies as an OOM kill would take it
        s.client.proc.wait(timeout=10)
        with pytest.raises(openai.InternalServerError) as info:
            client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
        assert info.value.status_code == 503 and "engine process exited" in info.value.body["message"]
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True)
        assert info.value.status_code == 503
        health = httpx.get(s.base_url + "/health")
        assert health.status_code == 503 and health.json()["error"]["code"] == "engine_unavailable"
        assert httpx.get(s.base_url + "/metrics").status_code == 200
    finally:
        s.close()


def test_engine_process_stops_with_the_server(tiny_dir):
    s = LiveServer(tiny_dir, max_model_len=64, engine_mode="process")
    proc = s.client.proc
    assert httpx.post(s.v1 + "/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
    s.close()
    assert proc.wait(timeout=10) == 0  # asked to stop, it stopped cleanly
