"""--runner auto and the pooler config: vLLM's rules for which runner and which pooling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.pooling_config import PoolerConfig, pooler_config_for, resolve_runner
from pagoda.runtime.tools.tiny_models import write_sentence_transformers


def arch(path) -> str:
    return json.loads((path / "config.json").read_text())["architectures"][0]


def test_auto_picks_pooling_for_sentence_transformers_and_bare_models(st_mean, bare_last, tiny_causal):
    assert resolve_runner("auto", Path(st_mean), "Qwen2ForCausalLM") == "pooling"
    assert arch(Path(bare_last)) == "LlamaModel"
    assert resolve_runner("auto", Path(bare_last), "LlamaModel") == "pooling"
    assert resolve_runner("auto", tiny_causal, arch(tiny_causal)) == "generate"
    assert resolve_runner("pooling", tiny_causal, arch(tiny_causal)) == "pooling"
    assert resolve_runner("generate", Path(st_mean), "Qwen2ForCausalLM") == "generate"
    with pytest.raises(ValueError, match="without an LM head"):
        resolve_runner("generate", Path(bare_last), "LlamaModel")


def test_pooler_config_from_files_defaults_and_override(tmp_path, tiny_causal):
    assert pooler_config_for("generate", tiny_causal, "LlamaForCausalLM") is None
    # vLLM's decoder default without sentence-transformers files.
    assert pooler_config_for("pooling", tiny_causal, "LlamaForCausalLM") == PoolerConfig("LAST", True)
    for mode, kind in (("mean_tokens", "MEAN"), ("cls_token", "CLS"), ("lasttoken", "LAST")):
        for normalize in (True, False):
            folder = tmp_path / f"{mode}-{normalize}"
            folder.mkdir()
            write_sentence_transformers(folder, mode, normalize)
            assert pooler_config_for("auto", folder, "LlamaForCausalLM") == PoolerConfig(kind, normalize)
    folder = tmp_path / "mean_tokens-True"
    override = '{"pooling_type": "cls", "normalize": false}'
    assert pooler_config_for("auto", folder, "X", override) == PoolerConfig("CLS", False)
    assert pooler_config_for("auto", folder, "X", '{"normalize": false}') == PoolerConfig("MEAN", False)


@pytest.mark.parametrize("override,message", [("{not json", "JSON object"), ("[1]", "JSON object"),
                                              ('{"pooling_type": "MAX"}', "LAST, MEAN, CLS"),
                                              ('{"softmax": true}', "softmax not supported"),
                                              ('{"normalize": "yes"}', "true or false")])
def test_a_bad_pooler_config_is_refused_with_a_reason(tiny_causal, override, message):
    with pytest.raises(ValueError, match=message):
        pooler_config_for("pooling", tiny_causal, "LlamaForCausalLM", override)


def test_pooling_modes_pagoda_cannot_apply_are_refused(tmp_path):
    write_sentence_transformers(tmp_path, "max_tokens", normalize=True)
    with pytest.raises(ValueError, match="exactly one of lasttoken, mean and cls"):
        pooler_config_for("auto", tmp_path, "LlamaForCausalLM")
    write_sentence_transformers(tmp_path, "mean_tokens", normalize=True)
    modules = json.loads((tmp_path / "modules.json").read_text())
    dense = {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}
    (tmp_path / "modules.json").write_text(json.dumps(modules + [dense]))
    with pytest.raises(ValueError, match="normalizes before a Dense"):
        pooler_config_for("auto", tmp_path, "LlamaForCausalLM")
    layer_norm = dict(dense, path="3_LayerNorm", type="sentence_transformers.models.LayerNorm")
    (tmp_path / "modules.json").write_text(json.dumps(modules[:2] + [layer_norm]))
    with pytest.raises(ValueError, match="LayerNorm"):
        pooler_config_for("auto", tmp_path, "LlamaForCausalLM")


def test_runner_flags_are_vllms():
    import argparse

    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    args = EngineArgs.from_cli_args(parser.parse_args(["--runner", "pooling", "--override-pooler-config",
                                                       '{"pooling_type": "MEAN"}']), model="m")
    assert (args.runner, args.pooler_config) == ("pooling", '{"pooling_type": "MEAN"}')
    with pytest.raises(SystemExit):
        parser.parse_args(["--runner", "embed"])
    with pytest.raises(ValueError, match="runner must be one of"):
        EngineArgs(model="m", runner="embed")
