"""CompileWatch: a Triton build after start-up is logged, one during start-up is not. Under the
interpreter nothing is compiled, so the hook is called the way Triton's JIT calls it."""

from __future__ import annotations

import logging
import types

from triton import knobs

from pagoda.runtime.worker.compile_watch import CompileWatch


def _compile(watch, manual=False):
    fn = types.SimpleNamespace(module="kernels.norm", name="_rms_norm_kernel")
    watch.on_compile(key="k", repr="_rms_norm_kernel[num_warps=4](n_rows: i32)", fn=fn, compile={},
                     is_manual_warmup=manual, already_compiled=False)


def test_compiles_after_startup_are_logged(caplog, monkeypatch):
    chained = []
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda **kw: chained.append(kw["repr"]))
    watch = CompileWatch()
    watch.install()
    assert knobs.runtime.jit_post_compile_hook == watch.on_compile
    with caplog.at_level(logging.WARNING, logger="pagoda.runtime.worker.compile_watch"):
        _compile(watch)  # start-up: expected
        assert watch.compiles_after_startup == 0 and not caplog.records
        watch.mark_started()
        _compile(watch, manual=True)  # an explicit kernel.warmup(): not a stall
        _compile(watch)
    assert watch.compiles_after_startup == 1
    (record,) = caplog.records
    assert "kernels.norm._rms_norm_kernel" in record.getMessage() and "n_rows: i32" in record.getMessage()
    assert len(chained) == 3  # a hook installed before ours still runs


def test_a_second_engine_starting_is_not_a_stall(caplog):
    """A process that starts another engine after the first has served (the GPU correctness run, the
    tests) builds that engine's kernels during its start-up: expected, so not logged."""
    watch = CompileWatch()
    watch.mark_starting()
    watch.mark_started()  # the first engine serves
    with caplog.at_level(logging.WARNING, logger="pagoda.runtime.worker.compile_watch"):
        watch.mark_starting()
        _compile(watch)  # the second one's load and warm-up
        watch.mark_started()
        assert watch.compiles_after_startup == 0 and not caplog.records
        _compile(watch)  # now one is a stall again
    assert watch.compiles_after_startup == 1 and len(caplog.records) == 1


def test_the_warning_names_every_argument_and_constexpr(caplog):
    """Triton's repr names only the first argument on 3.6, so the message is built from the signature
    and the constants the compile was given: which constexpr (a split count, a tile) was missed."""
    watch = CompileWatch()
    watch.mark_started()
    fn = types.SimpleNamespace(module="kernels.paged_attention_decode", name="_decode_kernel")
    with caplog.at_level(logging.WARNING, logger="pagoda.runtime.worker.compile_watch"):
        watch.on_compile(key="k", repr="_decode_kernel[num_warps=2, num_stages=3](q_ptr: ()",
                         fn=fn, compile={"signature": {"q_ptr": "*bf16", "seq_lens": "i32", "NUM_SPLITS": "constexpr"},
                                         "constants": {(2,): 4},
                                         "configs": [{(0,): [["tt.divisibility", 16]]}]},
                         is_manual_warmup=False, already_compiled=False)
    message = caplog.records[0].getMessage()
    assert ("_decode_kernel[num_warps=2, num_stages=3](q_ptr: *bf16 (16-divisible), seq_lens: i32, NUM_SPLITS=4)"
            in message)
