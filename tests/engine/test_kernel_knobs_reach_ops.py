"""Each kernel switch among EngineArgs' knobs reaches kernels.ops.configure, in one process and in
tensor-parallel workers alike: EngineArgs -> executor.runner_options -> ModelRunner (and EngineArgs ->
WorkerSpec -> distributed.launch.runner_options -> ModelRunner). A knob dropped on the way would
leave its switch at the default without a word."""

import dataclasses
import inspect

import torch

from pagoda.kernels import ops
from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.worker import executor, model_runner
from pagoda.runtime.worker.distributed import launch

# ops.configure's keywords that come from EngineArgs knobs of the same name (pdl: enable_pdl)
SWITCHES = {"enable_gemv": "enable_gemv", "fused_rope_kv": "fused_rope_kv", "pdl": "enable_pdl",
            "fold_gemv": "fold_gemv", "fold_residual": "fold_residual", "gemv_tma": "gemv_tma",
            "fold_rope_kv": "fold_rope_kv", "moe_tile": "moe_tile",
            "gemm_glu": "gemm_glu"}
# a value other than each non-boolean knob's default
NOT_DEFAULT = {"moe_tile": "16,32,64,4,2"}


def test_every_configure_switch_has_a_knob_and_the_runner_takes_it():
    configure = set(inspect.signature(ops.configure).parameters) - {"device"}
    assert configure == set(SWITCHES), "a new ops.configure switch needs its EngineArgs knob here"
    knobs = {f.name for f in dataclasses.fields(EngineArgs)}
    runner = set(inspect.signature(model_runner.ModelRunner.__init__).parameters)
    spec = {f.name for f in dataclasses.fields(launch.WorkerSpec)}
    for knob in SWITCHES.values():
        assert knob in knobs and knob in runner and knob in spec, knob


def test_non_default_switches_travel_both_ways_to_the_runner():
    flipped = {knob: NOT_DEFAULT.get(knob, not getattr(EngineArgs(model="m"), knob)) for knob in SWITCHES.values()}
    args = EngineArgs(model="m", **flipped)
    one_process = executor.runner_options(args)
    # as executor.build_executor hands them to TensorParallelExecutor, which builds its WorkerSpec
    options = one_process | {"max_num_batched_tokens": 8192, "pooling_type": None}
    del options["mixed_step_graphs"], options["max_mixed_graph_tokens"]  # (ranks replay decode graphs only)
    spec = launch.WorkerSpec(model_path="m", dtype="bfloat16", max_model_len=64, device_type="cpu", world_size=2,
                             start_timeout_s=1.0, **options)
    workers = launch.runner_options(spec)
    for knob, value in flipped.items():
        assert one_process[knob] == value and workers[knob] == value, knob


def test_configure_installs_the_rope_fold_switch():
    try:
        ops.configure(fold_rope_kv=False, device=torch.device("cpu"))
        assert ops.FOLD_ROPE_KV is False
        ops.configure(device=torch.device("cpu"))
        assert ops.FOLD_ROPE_KV is True  # the default since the H100 measured it ahead
    finally:
        ops.configure(device=torch.device("cpu"))


def test_configure_installs_the_moe_tile_and_the_runner_parses_it():
    try:
        ops.configure(moe_tile=dict(block_m=16, block_n=32, block_k=64, num_warps=4, num_stages=2),
                      device=torch.device("cpu"))
        assert ops.MOE_TILE == dict(block_m=16, block_n=32, block_k=64, num_warps=4, num_stages=2)
        ops.configure(device=torch.device("cpu"))
        assert ops.MOE_TILE is None  # the tuned table, then the defaults
    finally:
        ops.configure(device=torch.device("cpu"))
