"""Fixtures for the tests on the committed demo model (e2e/demo-model, made by
e2e/train_demo_model.py): transformers' model as the reference, the engine, and a live server.

Everything runs on the CPU in fp32, where the engine must match transformers token for token.
"""

from __future__ import annotations

import inspect
import json
import os
import sysconfig
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from serve_process import pagoda_serve

ROOT = Path(__file__).resolve().parents[2]
# PAGODA_DEMO_MODEL points the tests at another checkpoint made by the same script (for example
# a CPU `--tiny` run while developing).
DEMO_MODEL = Path(os.environ.get("PAGODA_DEMO_MODEL", ROOT / "e2e" / "demo-model"))
SERVED_NAME = "pagoda-demo"
NUM_KV_BLOCKS = 256  # 4k tokens: more than any test here holds at once, and small on the CPU


# Real prompts for prefix caching: modules that open with the same long import header.
HEADER = '''"""Helpers for reading, checking and rewriting project configuration files.

Configuration lives in INI, JSON or TOML files next to the project; these helpers find them,
merge them in a fixed order and report every problem with its file name and line number.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import io
import itertools
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_ENCODING = "utf-8"
SEARCH_PATH = ("setup.cfg", "tox.ini", "pyproject.toml")

'''

BODIES = [
    "def load_config(path):\n",
    "class ConfigError(Exception):\n",
    "def main(argv=None):\n    parser = argparse.ArgumentParser(",
    "@dataclass\nclass Entry:\n    name: str\n",
]


@pytest.fixture(scope="session")
def header_prompts() -> list[str]:
    return [HEADER + body for body in BODIES]


@pytest.fixture(scope="session")
def demo_model() -> Path:
    if not (DEMO_MODEL / "config.json").exists():
        pytest.skip(
            f"{DEMO_MODEL} holds no checkpoint yet: it is trained on the GPU machine by "
            "`python3 e2e/train_demo_model.py --out e2e/demo-model --minutes 8` and then committed"
        )
    return DEMO_MODEL


@pytest.fixture(scope="session")
def tokenizer(demo_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_model)


@pytest.fixture(scope="session")
def hf_model(demo_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(demo_model, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def max_model_len(demo_model) -> int:
    return json.loads((demo_model / "config.json").read_text())["max_position_embeddings"]


@pytest.fixture(scope="session")
def hf_greedy(hf_model) -> Callable[[list[int], int], tuple[list[int], list[float]]]:
    """transformers' greedy continuation, and at each step the gap between the two best logits.

    A hand-written loop over transformers' forward pass and KV cache, not `generate`: `generate`
    stops at (or, with min_new_tokens, masks) the EOS tokens, while the engine's `ignore_eos`
    keeps going with the unmodified argmax.
    """

    # transformers 5.2x renamed forward's `past_key_values` to `cache`; accept either version.
    cache_kw = "cache" if "cache" in inspect.signature(hf_model.forward).parameters else "past_key_values"

    @torch.no_grad()
    def run(prompt_ids: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
        out = hf_model(torch.tensor([prompt_ids]), use_cache=True)
        tokens, margins = [], []
        for _ in range(max_tokens):
            logits = out.logits[0, -1]
            top = logits.topk(2).values
            tokens.append(int(logits.argmax()))
            margins.append(float(top[0] - top[1]))
            if len(tokens) < max_tokens:
                cache = out.get("cache") if out.get("cache") is not None else out.past_key_values
                out = hf_model(torch.tensor([[tokens[-1]]]), use_cache=True, **{cache_kw: cache})
        return tokens, margins

    return run


@pytest.fixture(scope="session")
def make_engine(demo_model):
    from pagoda.runtime.engine_args import EngineArgs
    from pagoda.runtime.frontend.llm_engine import LLMEngine

    def make(**overrides):
        args = dict(model=str(demo_model), dtype="float32", device="cpu", num_kv_blocks=NUM_KV_BLOCKS)
        return LLMEngine.from_engine_args(EngineArgs(**(args | overrides)))

    return make


_request_ids = iter(range(1_000_000))


def run_engine(engine, prompts: list[list[int]], params) -> list:
    """Add every prompt, step until all finish, and return the final RequestOutputs in order."""
    ids = [f"demo-{next(_request_ids)}" for _ in prompts]
    for request_id, prompt in zip(ids, prompts):
        engine.add_request(request_id, None, prompt, params)
    final = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                final[output.request_id] = output
    return [final[i] for i in ids]


@pytest.fixture(scope="session")
def engine_runner():
    return run_engine


def heldout_sources(demo_model: Path) -> dict[str, str]:
    """The source of the modules the trainer held out, as this interpreter's stdlib has them."""
    modules = json.loads((demo_model / "train_metrics.json").read_text())["data"]["heldout_modules"]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = {}
    for name in modules:
        path = stdlib / f"{name}.py"
        path = path if path.exists() else stdlib / name / "__init__.py"
        if path.exists():
            sources[name] = path.read_text(encoding="utf-8")
    return sources


@pytest.fixture(scope="session")
def heldout(demo_model) -> dict[str, str]:
    sources = heldout_sources(demo_model)
    assert sources, "none of the held-out modules named in train_metrics.json is in this stdlib"
    return sources


@pytest.fixture(scope="session")
def demo_server(demo_model, tmp_path_factory):
    """`pagoda serve` on the demo model, fp32 on the CPU, in a subprocess; yields its base URL."""
    flags = ("--served-model-name", SERVED_NAME, "--dtype", "float32", "--device", "cpu",
             "--num-kv-blocks", str(NUM_KV_BLOCKS), "--log-level", "warning")
    log = tmp_path_factory.mktemp("demo-server") / "server.log"
    with pagoda_serve(demo_model, *flags, log_path=log, cwd=ROOT) as server:
        yield server.url


@pytest.fixture(scope="session")
def served_model_name() -> str:
    return SERVED_NAME


@pytest.fixture(scope="session")
def openai_client(demo_server):
    import openai

    return openai.OpenAI(base_url=f"{demo_server}/v1", api_key="unused", max_retries=0, timeout=120)
