"""A live uvicorn server on 127.0.0.1 around the real engine, and the tiny models the tests serve."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import torch
import uvicorn
from serve_process import free_port

from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.frontend.server.app import build_app
from pagoda.runtime.frontend.server.cli import build_engine_client, has_random_weights
from pagoda.runtime.frontend.server.serving import ServerConfig
from pagoda.runtime.tools.bench.bpe_vocab import bytes_to_unicode
from pagoda.runtime.tools.tiny_models import build_tiny_model

MODEL = "tiny"


class LiveServer:
    """uvicorn in a background thread; the engine steps in its own process (engine_mode="process")
    or in a thread of this one ("thread")."""

    def __init__(self, model_dir, *, api_key=None, max_queue_len=None, engine_mode="thread", server_config=None,
                 limits=None, **engine_kwargs):
        engine_kwargs.setdefault("device", "cpu")
        self.model_dir = str(model_dir)
        self.engine_mode = engine_mode
        self.client = build_engine_client(EngineArgs(model=self.model_dir, **engine_kwargs), engine_mode,
                                          log_level="warning")
        config = ServerConfig([MODEL], self.model_dir, api_key=api_key, max_queue_len=max_queue_len,
                              random_weights=has_random_weights(self.model_dir), **(server_config or {}))
        self.app = build_app(self.client, config, limits=limits)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn-{self.port}", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def stats(self) -> dict:
        """The engine client's latest EngineStats snapshot (taken by the engine after its last step)."""
        return self.client.stats()

    def wait_idle(self, timeout: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            s = self.stats()
            if s["num_running"] == 0 and s["num_waiting"] == 0 and not self.client._streams:
                return s
            if time.monotonic() > deadline:
                raise AssertionError(f"engine not idle after {timeout}s: {s}")
            time.sleep(0.02)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


# ---- models ----------------------------------------------------------------------------------


def byte_token_ids(tokenizer, data: bytes) -> list[int]:
    """One single-byte token per byte, so a multi-byte character spans several tokens."""
    alphabet = bytes_to_unicode()
    ids = [tokenizer.convert_tokens_to_ids(alphabet[b]) for b in data]
    assert all(i is not None and i != tokenizer.unk_token_id for i in ids), ids
    return ids


def build_cycle_model(path: Path, cycles: list[list[int]]) -> Path:
    """A tiny Llama whose greedy continuation walks fixed token cycles: after cycle[i] comes
    cycle[i+1]. The blocks' output projections are zero, so the last hidden state is the current
    token's embedding, and each lm_head row points at its predecessor's embedding. It never emits
    EOS, so it generates for as long as asked."""
    from transformers import AutoModelForCausalLM

    build_tiny_model(path, "llama", seed=1)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.model.embed_tokens.weight
        for cycle in cycles:
            for prev, nxt in zip(cycle, cycle[1:] + cycle[:1]):
                model.lm_head.weight[nxt] = emb[prev] * 10.0
    for f in list(path.glob("*.safetensors")) + list(path.glob("*.safetensors.index.json")):
        f.unlink()
    model.save_pretrained(path, max_shard_size="40KB")
    return path


class HF:
    """transformers' greedy generate on the same checkpoint: the reference for the engine."""

    def __init__(self, path):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path)

    @torch.no_grad()
    def greedy(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        ids = torch.tensor([prompt_ids])
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                  do_sample=False, pad_token_id=self.tokenizer.pad_token_id)
        new = out[0, len(prompt_ids):].tolist()
        eos = self.tokenizer.eos_token_id
        return new[: new.index(eos) + 1] if eos in new else new

    @torch.no_grad()
    def logprobs(self, ids: list[int]) -> torch.Tensor:
        """log-softmax of the next-token logits at every position of ids: [len(ids), vocab]."""
        logits = self.model(torch.tensor([ids])).logits[0].float()
        return torch.log_softmax(logits, dim=-1)

    def text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
