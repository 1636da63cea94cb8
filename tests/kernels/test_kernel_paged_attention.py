"""Paged attention, decode (split-KV, GQA-grouped) and prefill (varlen causal, prefix extension),
against paged_attention_ref under TRITON_INTERPRET=1. Cases are picked, not crossed: each one
covers a GQA ratio (1, 4, 7), a head dim (64, 128), a dtype, a block size (powers of two from 1 to
128) and lengths on both sides of block and tile boundaries."""

import pytest
import torch
from kernel_testing import paged_inputs, tolerance

from pagoda.kernels import paged_attention_prefill as prefill
from pagoda.kernels.paged_attention_decode import (
    FAT_TILE,
    choose_num_splits,
    choose_tile,
    paged_attention_decode,
)
from pagoda.kernels.paged_attention_prefill import paged_attention_prefill
from pagoda.kernels.paged_attention_ref import paged_attention_ref

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def check(got, query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale):
    want = paged_attention_ref(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale)
    assert not got.isnan().any(), "unwritten output or a read past seq_len"
    torch.testing.assert_close(got, want, **tolerance(query.dtype))


DECODE_CASES = [
    # group, head_dim, dtype, block_size, seq_lens, num_splits (None: chosen from the hint)
    (1, 64, F32, 16, [1, 16, 17, 33], None),
    (4, 128, BF16, 16, [5, 64, 65, 130], 3),
    (7, 64, F16, 8, [7, 8, 9, 100], 2),
    (4, 64, F32, 128, [1, 127, 129], 1),
    (7, 128, BF16, 32, [31, 32, 97], None),
    (1, 128, F16, 1, [1, 3, 70], 8),  # block size 1; 8 slices leave some of them empty
    (4, 64, BF16, 64, [200], 5),  # block spans one tile exactly; ragged slices
    (4, 80, F32, 16, [3, 40], 2),  # head_dim that is not a power of two
]


@pytest.mark.parametrize("group,head_dim,dtype,block_size,seq_lens,num_splits", DECODE_CASES)
def test_decode(group, head_dim, dtype, block_size, seq_lens, num_splits):
    args = paged_inputs([1] * len(seq_lens), seq_lens, 2, group, head_dim, block_size, dtype)
    scale = head_dim**-0.5
    out = torch.full_like(args[0], float("nan"))
    got = paged_attention_decode(*args, scale, max_seq_len=max(seq_lens), num_splits=num_splits,
                                 block_n=16 if num_splits == 5 else None, out=out)
    assert got is out
    check(got, *args, scale)


def test_decode_tile_follows_programs_per_sm():
    cpu = torch.device("cpu")  # 4 "SMs" under the interpreter
    assert choose_tile(19, 2, cpu) == FAT_TILE  # under 5 programs per SM: more bytes in flight each
    thin = choose_tile(20, 2, cpu)
    assert thin != FAT_TILE and thin[0] < FAT_TILE[0]
    assert choose_tile(4, 4, cpu)[0] == 32  # fp32 caches keep the small tile (shared memory)


def test_narrow_heads_take_the_fat_tile_at_any_program_count():
    cpu = torch.device("cpu")
    # Heads of 64 move half the bytes per position: the wide tile keeps the loads in flight.
    assert choose_tile(20, 2, cpu, head_dim=64) == FAT_TILE
    assert choose_tile(1 << 20, 2, cpu, head_dim=32) == FAT_TILE
    assert choose_tile(1 << 20, 2, cpu, head_dim=128) != FAT_TILE  # heads of 128 keep the thin tile
    assert choose_tile(1 << 20, 4, cpu, head_dim=64)[0] == 32  # fp32 still fits shared memory first


def test_decode_split_choice_is_host_only_and_bounded():
    cpu = torch.device("cpu")
    assert choose_num_splits(256, 8, 8192, cpu) == 1  # plenty of programs already
    assert choose_num_splits(1, 2, 100, cpu) == 1  # too short to split
    assert 1 < choose_num_splits(1, 2, 4096, cpu) <= 32


PREFILL_CASES = [
    # group, head_dim, dtype, block_size, q_lens, seq_lens, block_m, block_n
    (1, 64, F32, 16, [16, 1, 17], [16, 40, 50], None, None),  # fresh, decode row, extension
    (4, 128, BF16, 8, [33, 5], [33, 70], None, None),
    (7, 64, F16, 32, [20, 3, 1], [100, 3, 31], None, None),
    (4, 64, F32, 128, [31], [128], None, None),  # prefix of 97 cached tokens, one 128-block
    (1, 128, F16, 4, [40, 9], [45, 9], 32, 16),
    (7, 128, F32, 16, [18, 2], [18, 35], 16, 32),  # key tiles wider than query tiles
    (4, 96, F16, 16, [21], [40], None, None),  # head_dim that is not a power of two
    (7, 64, BF16, 16, [70, 1, 40], [70, 66, 100], 64, 32),  # 64-row tiles: the short-prompt winner for heads of 64
]


@pytest.mark.parametrize("group,head_dim,dtype,block_size,q_lens,seq_lens,block_m,block_n", PREFILL_CASES)
def test_prefill(group, head_dim, dtype, block_size, q_lens, seq_lens, block_m, block_n):
    args = paged_inputs(q_lens, seq_lens, 2, group, head_dim, block_size, dtype)
    scale = head_dim**-0.5
    out = torch.full_like(args[0], float("nan"))
    got = paged_attention_prefill(*args, scale, max_query_len=max(q_lens), block_m=block_m,
                                  block_n=block_n, out=out)
    assert got is out
    check(got, *args, scale)


def test_prefill_grid_from_an_upper_bound_hint():
    """A max_query_len hint above the real one only adds programs that exit at once."""
    args = paged_inputs([3, 1], [10, 21], 1, 4, 64, 16, F32)
    check(paged_attention_prefill(*args, 0.1, max_query_len=64), *args, 0.1)


def test_prefill_launch_for_heads_of_64_goes_by_context_length():
    """The launch rule itself (a CUDA device type needs no GPU here): heads of 64 take the
    short-prompt tile only where the max_seq_len hint says every sequence is short; no hint, or
    heads of 128, keep the launch they had."""
    cuda = torch.device("cuda")
    short, long = prefill.SHORT_TILE_64, prefill.LONG_TILE_64
    assert short != long
    assert prefill.default_config(64, BF16, cuda, prefill.SHORT_CONTEXT) == short
    assert prefill.default_config(64, F16, cuda, 300) == short
    assert prefill.default_config(64, BF16, cuda, prefill.SHORT_CONTEXT + 1) == long
    assert prefill.default_config(64, BF16, cuda) == long  # no hint: an unbounded context
    assert prefill.default_config(128, BF16, cuda, 300) == prefill.default_config(128, BF16, cuda)
    assert prefill.default_config(64, F32, cuda, 300) == prefill.default_config(64, F32, cuda)
    # the warm-up builds each launch the rule can give
    assert prefill.launches(64, BF16, cuda) == [long, short]
    assert len(prefill.launches(128, BF16, cuda)) == 1
    assert len(prefill.launches(64, BF16, torch.device("cpu"))) == 1


def test_mixed_step_hint_reaches_the_prefill_launch(monkeypatch):
    """ops.paged_attention hands the step's max_seq_len on to the prefill launch (and the result
    is the reference's whichever tile it takes)."""
    from pagoda.kernels import ops

    seen = []
    real = prefill.default_config

    def spy(head_dim, dtype, device, max_seq_len=None):
        seen.append(max_seq_len)
        return real(head_dim, dtype, device, max_seq_len)

    monkeypatch.setattr(prefill, "default_config", spy)
    args = paged_inputs([1, 5, 17], [9, 30, 17], 1, 7, 64, 16, F32)
    got = ops.paged_attention_triton(*args, 0.125, max_query_len=17, max_seq_len=30, num_decode_seqs=1)
    check(got, *args, 0.125)
    assert seen == [30]


@pytest.mark.parametrize("group,dtype,block_size", [(4, BF16, 16), (1, F32, 8), (7, F16, 32)])
def test_mixed_step_sends_its_one_token_rows_to_the_decode_kernel(group, dtype, block_size):
    """The dispatch of a mixed step: three one-token rows first (decode kernel), then a fresh
    prompt and a chunk over a cached prefix (prefill kernel), into one output."""
    from pagoda.kernels.ops import paged_attention_triton

    q_lens, seq_lens = [1, 1, 1, 9, 20], [5, 33, 70, 9, 47]
    args = paged_inputs(q_lens, seq_lens, 2, group, 64, block_size, dtype)
    out = torch.full_like(args[0], float("nan"))
    got = paged_attention_triton(*args, 0.125, max_query_len=20, max_seq_len=70, num_decode_seqs=3, out=out)
    assert got is out
    check(got, *args, 0.125)
