"""`pagoda download` (the loader Job's first step): the real huggingface_hub client against a local
stand-in for the Hub, run through the CLI as the Job runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


def test_mistral_consolidated_weights_beside_hf_shards_are_not_fetched(tmp_path):
    """A Mistral repository holds the weights twice; the runtime reads the HF shards only."""
    source = tmp_path / "repo"
    build_tiny_model(source, "mistral")
    (source / "consolidated.safetensors").write_bytes(b"mistral's own copy of the weights")
    (source / "params.json").write_text("{}")
    server = serve(source, "org/mistral")
    try:
        env = {"HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}", "HF_HUB_CACHE": str(tmp_path / "cache"),
               "HF_HUB_DISABLE_TELEMETRY": "1"}
        target = tmp_path / "out"
        result = pagoda("download", "hf://org/mistral@main", str(target), env=env)
        assert result.returncode == 0, result.stderr
        got = {p.name for p in target.iterdir() if p.name not in (MARKER, ".cache")}
        assert got == {p.name for p in source.iterdir()} - {"consolidated.safetensors"}
        assert any(name.startswith("model") and name.endswith(".safetensors") for name in got)
        # the dry run may ask about it (HEAD); its bytes are never fetched
        assert not any(method == "GET" and "consolidated" in path for method, path, *_ in server.requests)
    finally:
        server.shutdown()


def test_serving_a_hub_id_skips_mistral_consolidated_weights_too(tmp_path):
    """`pagoda serve org/name` fetches through resolve_model_path: the same rule as the loader Job."""
    source = tmp_path / "repo"
    build_tiny_model(source, "mistral")
    (source / "consolidated.safetensors").write_bytes(b"mistral's own copy of the weights")
    server = serve(source, "org/mistral")
    try:
        env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{server.server_port}",
                   HF_HUB_CACHE=str(tmp_path / "cache"), HF_HUB_DISABLE_TELEMETRY="1")
        code = "from pagoda.runtime.model_config import resolve_model_path; print(resolve_model_path('org/mistral'))"
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert result.returncode == 0, result.stderr
        folder = Path(result.stdout.strip().splitlines()[-1])
        got = {p.name for p in folder.iterdir()}
        assert "config.json" in got and any(n.startswith("model") and n.endswith(".safetensors") for n in got)
        assert "consolidated.safetensors" not in got
        assert not any(method == "GET" and "consolidated" in path for method, path, *_ in server.requests)
    finally:
        server.shutdown()


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


def fake_cache(root) -> None:
    """A cache claim after a few reloads: complete and half-done revisions, another model, a stray file."""
    for folder in ("org/tiny/main", "org/tiny/v1", "other/model/main"):
        (root / folder).mkdir(parents=True)
        (root / folder / "model.safetensors").write_bytes(b"old weights")
    (root / "org/tiny/main" / MARKER).write_text(json.dumps({"uri": "hf://org/tiny@main"}))
    (root / "README").write_text("not a model folder: left alone")


def test_a_complete_download_prunes_the_other_revisions(hub, tmp_path):
    _, server = hub
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}", "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
           "HF_HUB_DISABLE_TELEMETRY": "1"}  # fmt: skip
    root = tmp_path / "models" / "hf"
    fake_cache(root)
    target = root / "org" / "tiny" / "v2"

    # A download that fails prunes nothing: the old revisions are what still serves.
    failed = pagoda("download", "hf://org/missing@v2", str(root / "org/missing/v2"), "--prune-root", str(root), env=env)
    assert failed.returncode != 0
    assert all((root / f / "model.safetensors").is_file() for f in ("org/tiny/main", "org/tiny/v1", "other/model/main"))

    result = pagoda("download", "hf://org/tiny@v2", str(target), "--prune-root", str(root), env=env)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["pruned"] == ["org/missing/v2", "org/tiny/main", "org/tiny/v1", "other/model/main"]
    assert [str(p.relative_to(root)) for p in root.glob("*/*/*")] == ["org/tiny/v2"]
    assert (target / "config.json").is_file() and (target / MARKER).is_file()
    assert sorted(p.name for p in root.iterdir()) == ["README", "org"]  # other/ went once empty

    # The layout the serving pods read: the URI's own folder, as the operator mounts it.
    from pagoda.runtime.model_uri import CACHE_MOUNT, ModelURI

    assert ModelURI.parse("hf://org/tiny@v2").mount_path == f"{CACHE_MOUNT}/hf/org/tiny/v2"


def test_prune_keeps_only_a_model_folder_of_the_root(tmp_path):
    from pagoda.runtime.download import prune

    root = tmp_path / "hf"
    fake_cache(root)
    with pytest.raises(ValueError, match="not a model folder"):
        prune(root, root / "org" / "tiny")  # a typo must not wipe the claim
    with pytest.raises(ValueError):
        prune(root, tmp_path / "elsewhere" / "a" / "b" / "c")
    assert prune(root, root / "org" / "tiny" / "main") == ["org/tiny/v1", "other/model/main"]
    assert (root / "org/tiny/main/model.safetensors").read_bytes() == b"old weights"


def hub_env(server, tmp_path) -> dict:
    return {"HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}", "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
            "HF_HUB_DISABLE_TELEMETRY": "1"}  # fmt: skip


def test_a_model_the_volume_cannot_hold_fails_before_any_weight_is_fetched(hub, tmp_path):
    import shutil

    source, _ = hub
    free = shutil.disk_usage(tmp_path).free
    shard = next(p.name for p in source.iterdir() if p.suffix == ".safetensors")
    big = serve(source, "org/big", sizes={shard: free + 2**30})  # the Hub says: one GiB more than is free
    try:
        target, cause = tmp_path / "org" / "big" / "main", tmp_path / "termination-log"
        result = pagoda("download", "hf://org/big@main", str(target), "--error-file", str(cause),
                        env=hub_env(big, tmp_path))  # fmt: skip
        assert result.returncode == 1, result.stderr
        message = cause.read_text()
        assert message.startswith("CacheTooSmall: hf://org/big@main needs ") and "spec.cache.size" in message
        assert message in result.stderr
        assert not any(method == "GET" and "/resolve/" in path for method, path, _ in big.requests), big.requests
        assert not (target / shard).exists() and not (target / MARKER).exists()
    finally:
        big.shutdown()


def test_a_failed_download_writes_its_cause_to_the_error_file(hub, tmp_path):
    _, server = hub
    cause = tmp_path / "termination-log"
    result = pagoda("download", "hf://org/missing@main", str(tmp_path / "m"), "--error-file", str(cause),
                    env=hub_env(server, tmp_path))  # fmt: skip
    assert result.returncode == 1
    message = cause.read_text()
    assert "\n" not in message and "org/missing" in message and message in result.stderr


def test_a_model_that_fits_is_downloaded_after_the_check(hub, tmp_path):
    """The dry run counts the real sizes: a model far smaller than the free space goes through."""
    _, server = hub
    target = tmp_path / "org" / "tiny" / "main"
    result = pagoda("download", "hf://org/tiny@main", str(target), env=hub_env(server, tmp_path))
    assert result.returncode == 0, result.stderr
    assert (target / "config.json").is_file()
