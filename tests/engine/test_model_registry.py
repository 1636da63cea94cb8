"""architectures[0] picks the model class; an unknown one is refused, naming the supported set,
both by the engine and by `pagoda plan`."""

from __future__ import annotations

import json
import shutil

import pytest

from pagoda.runtime import LLM
from pagoda.runtime.models import SUPPORTED_ARCHITECTURES
from pagoda.runtime.plan import make_plan

FAMILY_ARCHS = {"Qwen3ForCausalLM"}


def test_supported_set_names_the_new_families():
    assert FAMILY_ARCHS <= set(SUPPORTED_ARCHITECTURES)


def test_unknown_architecture_is_refused_with_the_supported_list(tiny_models, tmp_path):
    path = tmp_path / "unknown"
    shutil.copytree(tiny_models["llama"], path)
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["FalconMambaForCausalLM"]
    (path / "config.json").write_text(json.dumps(config))
    for build in (lambda: LLM(str(path), device="cpu", max_model_len=64), lambda: make_plan(str(path), 80)):
        with pytest.raises(ValueError) as err:
            build()
        message = str(err.value)
        assert "'FalconMambaForCausalLM' is not supported" in message
        assert all(arch in message for arch in SUPPORTED_ARCHITECTURES)
