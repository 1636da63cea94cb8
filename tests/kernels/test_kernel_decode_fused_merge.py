"""The split-KV merge fused into the decode kernel (the last slice of each (seq, kv_head) to arrive
merges) against the two launches it replaces, bit for bit, and both against paged_attention_ref,
under TRITON_INTERPRET=1. There programs run one after another, so the last split is always the
merger; the arrival counters must still be all zeros after every call, as a graph replay needs."""

import pytest
import torch
from kernel_testing import paged_inputs, tolerance

import pagoda.kernels.paged_attention_decode as dec
from pagoda.kernels.paged_attention_ref import paged_attention_ref

F32, F16, BF16, FP8 = torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn
CPU = torch.device("cpu")


@pytest.fixture
def merges(monkeypatch):
    """The grids _merge_kernel is launched with: none when the decode kernel merged itself."""
    grids, kernel = [], dec._merge_kernel

    class Spy:
        def __getitem__(self, grid):
            grids.append(grid)
            return kernel[grid]

    monkeypatch.setattr(dec, "_merge_kernel", Spy())
    return grids


def inputs(q_lens, seq_lens, group, head_dim, block_size, dtype, cache_dtype):
    args = paged_inputs(q_lens, seq_lens, 2, group, head_dim, block_size, cache_dtype or dtype)
    if cache_dtype:  # an FP8 cache under queries of the compute dtype, as in test_kernel_fp8
        args = (torch.randn(args[0].shape).to(dtype), *args[1:])
    return args


def decode(args, scale, layer, num_splits):
    out = torch.full_like(args[0], float("nan"))
    got = dec.paged_attention_decode(*args, scale, **layer, max_seq_len=int(args[4].max()),
                                     num_splits=num_splits, out=out)
    assert got is out and not got.isnan().any(), "an unwritten output row"
    return got


def counters_are_zero():
    return not dec._COUNTERS[CPU].any()


FUSED_CASES = [
    # group, head_dim, dtype, cache dtype (None: dtype), block_size, q_lens, seq_lens, num_splits, window, softcap
    (1, 64, F32, None, 16, [1, 1, 1], [1, 40, 300], 2, None, None),
    (4, 128, BF16, None, 16, [1, 0, 1, 1], [5, 64, 130, 257], 4, None, None),  # a skipped row
    (4, 64, F16, None, 8, [1, 1, 0], [3, 100, 200], 8, 40, None),  # window; 8 slices leave some empty
    (1, 128, BF16, None, 32, [0, 1], [9, 333], 8, None, 30.0),  # soft-cap
    (4, 64, F32, FP8, 16, [1, 1, 1], [17, 40, 130], 4, None, None),
    (4, 64, BF16, FP8, 16, [1, 0, 1], [1, 60, 290], 2, 50, 20.0),  # everything at once
]


@pytest.mark.parametrize("group,head_dim,dtype,cache_dtype,block_size,q_lens,seq_lens,num_splits,window,softcap",
                         FUSED_CASES)
def test_fused_merge_matches_two_launches_bit_for_bit(monkeypatch, merges, group, head_dim, dtype, cache_dtype,
                                                      block_size, q_lens, seq_lens, num_splits, window, softcap):
    args = inputs(q_lens, seq_lens, group, head_dim, block_size, dtype, cache_dtype)
    if softcap:  # scores large enough for the cap to bite
        args = (args[0] * 4, *args[1:])
    scale = head_dim**-0.5
    layer = dict(sliding_window=window, softcap=softcap)
    if cache_dtype:
        layer.update(k_scale=0.07, v_scale=1.7)

    fused = decode(args, scale, layer, num_splits)
    assert merges == [] and counters_are_zero()
    again = decode(args, scale, layer, num_splits)  # a second call (a replay) finds the counters zeroed
    assert torch.equal(again, fused) and counters_are_zero()

    monkeypatch.setattr(dec, "FUSED_MERGE", False)
    two = decode(args, scale, layer, num_splits)
    assert len(merges) == 1
    assert torch.equal(fused, two)

    want = paged_attention_ref(*args, scale, **layer)
    torch.testing.assert_close(fused, want, **tolerance(dtype))
    torch.testing.assert_close(two, want, **tolerance(dtype))


def test_more_pairs_than_counters_take_two_launches(monkeypatch, merges):
    """Three sequences of two KV heads are six (seq, kv_head) pairs."""
    monkeypatch.setattr(dec, "_COUNTERS", {})  # so a buffer of the small capacity is not kept
    args = inputs([1, 1, 1], [20, 90, 300], 4, 64, 16, F32, None)
    want = paged_attention_ref(*args, 0.125)
    monkeypatch.setattr(dec, "COUNTER_CAPACITY", 6)  # just enough: fused
    fused = decode(args, 0.125, {}, 4)
    assert merges == [] and dec._COUNTERS[CPU].numel() == 6 and counters_are_zero()
    monkeypatch.setattr(dec, "COUNTER_CAPACITY", 5)
    two = decode(args, 0.125, {}, 4)
    assert len(merges) == 1 and counters_are_zero()
    assert torch.equal(fused, two)
    torch.testing.assert_close(two, want, **tolerance(F32))


def test_more_slices_than_fused_max_take_two_launches(merges):
    args = inputs([1, 1], [40, 700], 4, 64, 16, BF16, None)
    got = decode(args, 0.125, {}, 2 * dec.FUSED_MAX_SPLITS)
    assert len(merges) == 1
    torch.testing.assert_close(got, paged_attention_ref(*args, 0.125), **tolerance(BF16))


def test_one_split_neither_merges_nor_counts(merges):
    args = inputs([1, 1], [5, 70], 4, 64, 16, BF16, None)
    got = decode(args, 0.125, {}, 1)
    assert merges == []
    torch.testing.assert_close(got, paged_attention_ref(*args, 0.125), **tolerance(BF16))
