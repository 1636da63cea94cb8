"""`pagoda download` (the loader Job's first step): the real huggingface_hub client against a local
stand-in for the Hub, run through the CLI as the Job runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fakehub import serve

from pagoda.runtime.download import MARKER
from pagoda.runtime.tools.tiny_models import build_tiny_model


def pagoda(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pagoda.runtime.cli", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, **(env or {})),
        timeout=120,
    )


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    source = tmp_path_factory.mktemp("repo")
    build_tiny_model(source, "qwen2")
    (source / "pytorch_model.bin").write_bytes(b"not wanted")  # the runtime reads safetensors only
    server = serve(source, "org/tiny")
    yield source, server
    server.shutdown()


def test_hf_download_fills_the_folder_once(hub, tmp_path):
    source, server = hub
    env = {
        "HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
        "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
        "HF_TOKEN": "hf_secret_token",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    target = tmp_path / "models" / "hf" / "org" / "tiny" / "main"
    result = pagoda("download", "hf://org/tiny@main", str(target), env=env)
    assert result.returncode == 0, result.stderr
    wanted = {p.name for p in source.iterdir()} - {"pytorch_model.bin"}
    got = {p.name for p in target.iterdir() if p.name not in (MARKER, ".cache")}
    assert got == wanted
    for name in wanted:
        assert (target / name).read_bytes() == (source / name).read_bytes()
    marker = json.loads((target / MARKER).read_text())
    assert marker["uri"] == "hf://org/tiny@main" and marker["files"] == len(wanted)
    assert all(auth == "Bearer hf_secret_token" for *_, auth in server.requests)

    # A retried Job finds the marker and fetches nothing.
    before = len(server.requests)
    again = pagoda("download", "hf://org/tiny@main", str(target), env=env)
    assert again.returncode == 0 and "already complete" in again.stdout
    assert len(server.requests) == before


def test_pvc_uri_is_used_in_place(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    ok = pagoda("download", "pvc://weights/llama", str(tmp_path))
    assert ok.returncode == 0 and "in place" in ok.stdout
    missing = pagoda("download", "pvc://weights/llama", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "config.json" in missing.stderr


def test_bad_uri_is_refused(tmp_path):
    result = pagoda("download", "s3://bucket/model", str(tmp_path))
    assert result.returncode == 2 and "hf://org/name" in result.stderr


def test_download_does_not_import_torch():
    code = "import sys, pagoda.runtime.download, pagoda.operator.main; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
