"""Shared fixtures: tiny checkpoints, live servers on them (real engine), and the HF reference.

`server` and `cycle_server` run the engine in its own process, as `pagoda serve` does by default;
`queue_server` and the servers tests build for themselves run it in a thread, so both engine
clients serve the whole API in these tests."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pagoda.runtime.tools.tiny_models import build_tiny_model

from .live import HF, LiveServer, build_cycle_model, byte_token_ids


@dataclass
class CycleModel:
    path: str
    euro: list[int]  # "x€": one ASCII token, then the three single-byte tokens of "€"
    letters: list[int]  # "pqrst", one token per letter


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", "llama"))


@pytest.fixture(scope="session")
def cycle_model(tmp_path_factory) -> CycleModel:
    from pagoda.runtime.tools.tiny_models import build_tokenizer

    tok = build_tokenizer()
    euro = byte_token_ids(tok, b"x") + byte_token_ids(tok, "€".encode())
    letters = byte_token_ids(tok, b"pqrst")
    path = build_cycle_model(tmp_path_factory.mktemp("cycle") / "llama", [euro, letters])
    return CycleModel(str(path), euro, letters)


@pytest.fixture(scope="session")
def hf_tiny(tiny_dir) -> HF:
    return HF(tiny_dir)


@pytest.fixture(scope="session")
def server(tiny_dir):
    s = LiveServer(tiny_dir, max_model_len=256, engine_mode="process")
    yield s
    s.close()


@pytest.fixture(scope="session")
def cycle_server(cycle_model):
    s = LiveServer(cycle_model.path, max_model_len=512, engine_mode="process")
    yield s
    s.close()


@pytest.fixture(scope="session")
def queue_server(cycle_model):
    """One sequence at a time and at most two waiting: a queue that fills up on demand."""
    s = LiveServer(cycle_model.path, max_model_len=512, max_num_seqs=1, max_queue_len=2)
    yield s
    s.close()
