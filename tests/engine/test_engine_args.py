"""One source for engine knobs: EngineArgs spells `pagoda serve`'s flags, LLM's keywords and the
operator's flags, in vLLM's forms; an unknown keyword is named with its close matches."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from pagoda.operator.builders.deployment import engine_knobs, serve_args
from pagoda.operator.spec import EngineSpec, ModelServer
from pagoda.runtime.cli import build_parser
from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.frontend.server.cli import engine_args_from


def _serve(*flags: str):
    return build_parser("serve").parse_args(["serve", "m", *flags])


def test_vllm_flag_forms_parse():
    args = _serve("--dtype", "half", "--max-model-len", "32k", "--api-key", "k1", "k2", "--no-enable-prefix-caching",
                  "--generation-config", "vllm", "--tokenizer", "tok", "--revision", "v2", "--max-logprobs", "5",
                  "--disable-log-stats", "--enable-log-requests", "-tp", "2")
    engine = engine_args_from(args)
    assert args.api_key == ["k1", "k2"]
    assert (engine.dtype, engine.max_model_len, engine.enable_prefix_caching) == ("half", 32000, False)
    assert (engine.generation_config, engine.tokenizer, engine.revision, engine.max_logprobs) == ("vllm", "tok", "v2", 5)
    assert engine.disable_log_stats and engine.enable_log_requests and engine.tensor_parallel_size == 2
    # vLLM's human_readable_int: k/m decimal, K/M binary (whole numbers only); auto or -1 = config.json's.
    for text, want in (("32K", 32768), ("1.5k", 1500), ("1m", 10**6), ("2M", 2 * 2**20), ("4096", 4096),
                       ("auto", None), ("-1", None)):
        assert engine_args_from(_serve("--max-model-len", text)).max_model_len == want, text
    assert engine_args_from(_serve("--max-num-batched-tokens", "16k")).max_num_batched_tokens == 16000
    assert engine_args_from(_serve("--enable-prefix-caching")).enable_prefix_caching is True
    assert engine_args_from(_serve()) == EngineArgs(model="m")  # no flag: EngineArgs' own defaults
    with pytest.raises(SystemExit):
        _serve("--max-model-len", "lots")
    with pytest.raises(SystemExit):
        _serve("--max-model-len", "1.5K")
    with pytest.raises(SystemExit):
        _serve("--dtype", "fp8")
    with pytest.raises(SystemExit):  # a plain switch, as in vLLM
        _serve("--no-disable-log-stats")


def test_moe_tile_is_checked_where_it_is_given():
    """--moe-tile (once the PAGODA_MOE_CONFIG env var) names one fused-MoE launch; a malformed one
    is refused by the parser and by EngineArgs, naming the knob, before any model loads."""
    from pagoda.runtime.engine_args import moe_tile_config

    engine = engine_args_from(_serve("--moe-tile", "16,64,128,4,3"))
    assert moe_tile_config(engine.moe_tile) == dict(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=3)
    assert moe_tile_config(EngineArgs(model="m").moe_tile) is None
    for bad in ("16,64,128,4", "16,64,x,4,3", "24,64,128,4,3", "16,64,128,4,0"):
        with pytest.raises(SystemExit):
            _serve("--moe-tile", bad)
        with pytest.raises(ValueError, match="moe_tile"):
            EngineArgs(model="m", moe_tile=bad)


def test_unknown_keyword_names_close_matches(tiny_models):
    from pagoda.runtime import LLM

    with pytest.raises(TypeError, match=r"'max_num_seq' \(did you mean 'max_num_seqs'\?\)"):
        LLM(tiny_models["llama"], device="cpu", max_num_seq=4)
    with pytest.raises(TypeError, match=r"'enable_prefix_cache' \(did you mean 'enable_prefix_caching'"):
        EngineArgs(model="m", enable_prefix_cache=False)
    with pytest.raises(TypeError, match=r"unknown engine argument: 'zzz'$"):
        EngineArgs(model="m", zzz=1)
    with pytest.raises(ValueError, match="dtype must be one of"):
        EngineArgs(model="m", dtype="fp8")


def _modelserver(engine: dict, **spec) -> ModelServer:
    body = {"apiVersion": "pagoda.dev/v1alpha1", "kind": "ModelServer",
            "metadata": {"name": "m", "namespace": "ml", "uid": "u", "generation": 1},
            "spec": {"model": {"uri": "hf://org/m"}, "engine": engine, **spec}}
    return ModelServer.from_body(copy.deepcopy(body))


def test_operator_engine_spec_maps_onto_engine_flags():
    """Every setting of a ModelServer's `engine` reaches `pagoda serve` as the EngineArgs knob of
    the same name, through flags the serve parser accepts."""
    knobs = {f.name for f in dataclasses.fields(EngineArgs)}
    spec_fields = set(EngineSpec.model_fields) - {"extra_args"}
    assert spec_fields <= knobs, spec_fields - knobs
    engine = {"maxModelLen": 4096, "gpuMemoryUtilization": 0.8, "maxNumSeqs": 64, "maxNumBatchedTokens": 2048,
              "dtype": "float16", "enablePrefixCaching": False, "tensorParallelSize": 2, "quantization": "fp8",
              "kvCacheDtype": "fp8_e4m3", "runner": "pooling"}
    ms = _modelserver(engine, resources={"gpus": 2})
    assert set(engine_knobs(ms)) <= knobs
    args = build_parser("serve").parse_args(["serve", *serve_args(ms, "/models/m")])
    parsed = engine_args_from(args)
    want = ms.spec.engine
    assert (parsed.max_model_len, parsed.gpu_memory_utilization, parsed.max_num_seqs) == (4096, 0.8, 64)
    assert (parsed.max_num_batched_tokens, parsed.dtype) == (want.max_num_batched_tokens, want.dtype)
    assert parsed.enable_prefix_caching is False and parsed.tensor_parallel_size == 2
    assert (parsed.quantization, parsed.kv_cache_dtype, parsed.runner) == ("fp8", "fp8_e4m3", "pooling")
    # Unset settings leave the runtime's defaults, and a CPU pod runs on the CPU.
    cpu = engine_args_from(build_parser("serve").parse_args(
        ["serve", *serve_args(_modelserver({}, resources={"gpus": 0}), "/models/m")]))
    defaults = EngineArgs(model="/models/m")
    assert (cpu.max_model_len, cpu.max_num_seqs, cpu.enable_prefix_caching, cpu.device, cpu.runner) == (
        defaults.max_model_len, defaults.max_num_seqs, True, "cpu", "auto")


def _other_value(f):
    """A value for knob f that differs from its default and that its flag accepts."""
    meta, default = f.metadata, f.default
    if meta["type"] is bool:
        return not default
    if meta["choices"]:
        return next(c for c in meta["choices"] if c != default)
    if meta["nargs"]:
        return ["a", "b"]
    if f.name == "moe_tile":
        return "16,32,64,4,2"
    if meta["type"] is float:
        return 0.5 if default != 0.5 else 0.25
    if meta["type"] is str:
        return "other"
    return 7 if default != 7 else 9  # the integer knobs, plain or human_int


def test_every_knob_round_trips_through_its_flags():
    """to_cli_flags (the operator's builder) writes what the serve parser reads back, knob by knob."""
    from pagoda.runtime.engine_args import cli_knobs, to_cli_flags

    by_name = {f.name: f for f in dataclasses.fields(EngineArgs)}
    for name in cli_knobs():
        f = by_name[name]
        if f.metadata["type"] is bool and not f.metadata["negatable"] and f.default:
            continue  # a switch on by default has no flag that turns it off
        value = _other_value(f)
        parsed = engine_args_from(_serve(*to_cli_flags({name: value})))
        assert getattr(parsed, name) == value, name
        assert parsed == dataclasses.replace(EngineArgs(model="m"), **{name: value}), name
