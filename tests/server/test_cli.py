"""`pagoda serve --help`, `pagoda plan` from config.json alone, and `make demo`'s script."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import httpx
from serve_process import free_port

from pagoda.runtime.cli import build_parser

SERVE_FLAGS = ["--host", "--port", "--served-model-name", "--api-key", "--max-model-len",
               "--gpu-memory-utilization", "--max-num-seqs", "--max-num-batched-tokens", "--block-size",
               "--num-kv-blocks", "--no-enable-prefix-caching", "--dtype", "--device", "--load-format", "--seed",
               "--chat-template", "--max-queue-len", "--log-level", "--enforce-eager",
               # vLLM's names and forms (issue 16)
               "--enable-prefix-caching", "--tokenizer", "--revision", "--generation-config", "--disable-log-stats",
               "--enable-log-requests", "--max-logprobs", "--tensor-parallel-size"]

# Llama-3.1-8B's config.json (the W1 model of BENCHMARKS.md).
LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5,
}


def _serve_help() -> str:
    parser = build_parser("serve")
    sub = next(a for a in parser._actions if a.dest == "command").choices["serve"]
    return sub.format_help()


def test_serve_help_documents_every_flag():
    text = _serve_help()
    for flag in SERVE_FLAGS:
        assert re.search(rf"{flag}\b", text), flag
    assert re.search(r"--dtype \{auto,half,float16,bfloat16,float,float32\}", text)
    assert "KEY [KEY ...]" in text  # --api-key takes several keys
    # Every option has a help line.
    sub = next(a for a in build_parser("serve")._actions if a.dest == "command").choices["serve"]
    assert all(a.help for a in sub._actions)


def test_serve_flags_parse(monkeypatch):
    monkeypatch.setenv("PAGODA_API_KEY", "from-env")
    args = build_parser("serve").parse_args(["serve", "m", "--port", "9000", "--no-enable-prefix-caching",
                                             "--max-queue-len", "4", "--served-model-name", "a", "b"])
    assert (args.api_key, args.port, args.enable_prefix_caching, args.max_queue_len) == (["from-env"], 9000, False, 4)
    assert args.served_model_name == ["a", "b"] and args.host == "0.0.0.0"
    from pagoda.runtime.frontend.server.cli import engine_args_from

    engine_args = engine_args_from(args)
    assert engine_args.enable_prefix_caching is False and engine_args.served_model_name == ["a", "b"]


def test_cli_modules_do_not_import_torch():
    code = ("import sys; import pagoda.runtime.frontend.server.cli, pagoda.runtime.plan; "
            "from pagoda.runtime.cli import build_parser; build_parser('serve').format_help(); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plan_from_config_json_alone(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]  # no weights, no tokenizer
    cmd = [sys.executable, "-m", "pagoda.runtime.cli", "plan", str(tmp_path), "--gpu-memory-gib", "80",
           "--max-model-len", "8192", "--json"]
    plan = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    # By hand: embeddings and lm_head 2 x 128256 x 4096; per layer q,o 4096^2 each, k,v 4096 x 1024
    # each, MLP 3 x 4096 x 14336, two norms of 4096; one final norm.
    per_layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    params = 2 * 128256 * 4096 + 32 * per_layer + 4096
    assert params == 8_030_261_248
    assert plan["num_parameters"] == params and plan["dtype"] == "bfloat16"
    assert plan["weight_bytes"] == params * 2
    assert plan["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2 == 131_072  # K and V, layers, kv heads, dim, bf16
    usable = int(80 * 2**30 * 0.9)
    blocks = (usable - params * 2) // (16 * 131_072)
    assert plan["usable_bytes"] == usable and plan["num_kv_blocks"] == blocks == 29_205
    assert plan["kv_capacity_tokens"] == blocks * 16 == 467_280
    assert plan["max_concurrent_seqs"] == 467_280 // 8192 == 57 and plan["fits"] is True
    # The human-readable form prints the same numbers.
    text = subprocess.run(cmd[:-1], check=True, capture_output=True, text=True).stdout
    assert "467280" in text and "57 sequences" in text and "131072 bytes" in text


def test_plan_says_when_nothing_fits(tmp_path, capsys):
    from pagoda.runtime.plan import make_plan

    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    plan = make_plan(str(tmp_path / "config.json"), gpu_memory_gib=16, max_model_len=8192)
    assert plan["fits"] is False and plan["num_kv_blocks"] == 0
    args = build_parser("plan").parse_args(["plan", str(tmp_path), "--gpu-memory-gib", "16"])
    from pagoda.runtime.plan import run

    assert run(args) == 1 and "NO" in capsys.readouterr().out


def test_plan_matches_the_engine(server):
    """The engine's start-up arithmetic and `pagoda plan` agree on what they both compute."""
    from pagoda.runtime.plan import make_plan

    engine_plan = server.client.memory_plan
    plan = make_plan(server.model_dir, gpu_memory_gib=1, max_model_len=256)
    assert plan["weight_bytes"] == engine_plan.weight_bytes
    assert plan["kv_bytes_per_token"] == engine_plan.kv_bytes_per_token
    assert plan["block_bytes"] == engine_plan.block_bytes


def test_demo_serves_and_its_snippets_work(tmp_path):
    port = free_port()
    cache = tmp_path / "demo-model-random"
    cmd = [sys.executable, "-m", "pagoda.runtime.tools.demo", "--model", str(tmp_path / "missing"), "--cache-dir",
           str(cache), "--port", str(port), "--max-model-len", "128", "--max-num-seqs", "4", "--device", "cpu",
           "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        out, deadline = [], time.monotonic() + 120
        for line in proc.stdout:
            out.append(line)
            if line.startswith("Metrics:") or time.monotonic() > deadline:
                break
        text = "".join(out)
        assert "RANDOM weights" in text, text
        assert (cache / "config.json").is_file()
        card = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]
        assert card["id"] == "pagoda-demo" and card["random_weights"] is True
        curl = next(line for line in out if line.startswith("curl "))
        if shutil.which("curl"):
            reply = json.loads(subprocess.run(curl, shell=True, check=True, capture_output=True, text=True).stdout)
            assert reply["object"] == "text_completion" and reply["usage"]["completion_tokens"] > 0
        snippet = text.split("python - <<'EOF'\n", 1)[1].split("\nEOF", 1)[0]
        result = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_chat_template_flag_takes_a_file_or_a_literal(tmp_path, tiny_dir):
    from pagoda.runtime.frontend.server.cli import read_chat_template

    from .live import LiveServer

    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    (tmp_path / "t.jinja").write_text(template)
    assert read_chat_template(str(tmp_path / "t.jinja")) == template
    assert read_chat_template(template) == template
    s = LiveServer(tiny_dir, max_model_len=64, chat_template=read_chat_template(str(tmp_path / "t.jinja")))
    try:
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
        ids = httpx.post(s.base_url + "/tokenize", json={"messages": messages}).json()["tokens"]
        text = httpx.post(s.base_url + "/detokenize", json={"tokens": ids}).json()["prompt"]
        assert text == "<system>be brief<user>hi"
    finally:
        s.close()


def test_serve_freezes_its_startup_heap_before_it_serves(monkeypatch):
    """`pagoda serve` hands uvicorn a frozen heap: what it built before serving is out of the
    collector's full passes (freeze_startup_heap), which run on the event loop that streams tokens."""
    import gc
    from types import SimpleNamespace

    import uvicorn

    from pagoda.runtime.frontend.server import cli as serve_cli

    seen = {}

    class Server:
        started = True

        def __init__(self, config):
            self.config, self.should_exit = config, False

        def run(self):
            seen["frozen"] = gc.get_freeze_count()

    app = SimpleNamespace(state=SimpleNamespace(client=SimpleNamespace(on_engine_death=[])))
    monkeypatch.setattr(uvicorn, "Server", Server)
    monkeypatch.setattr(serve_cli, "build_server", lambda args: app)
    gc.unfreeze()
    try:
        assert serve_cli.run(build_parser("serve").parse_args(["serve", "m", "--log-level", "warning"])) == 0
    finally:
        gc.unfreeze()  # hand the test process its heap back
    assert seen["frozen"] > 1000  # the interpreter, pytest and the imported libraries at least
