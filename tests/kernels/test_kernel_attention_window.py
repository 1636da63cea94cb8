"""Sliding-window attention and score soft-capping in the paged decode and prefill kernels, against
paged_attention_ref under TRITON_INTERPRET=1. The blocks wholly before a sequence's first window
are poisoned with NaN, as a freed block may hold anything: a kernel that reads them fails."""

import pytest
import torch
from kernel_testing import paged_inputs, tolerance

from pagoda.kernels.paged_attention_decode import paged_attention_decode
from pagoda.kernels.paged_attention_prefill import paged_attention_prefill
from pagoda.kernels.paged_attention_ref import paged_attention_ref

F32, BF16 = torch.float32, torch.bfloat16


def poison_outside_windows(k_cache, v_cache, block_tables, q_lens, seq_lens, window, block_size):
    for s, (q_len, seq_len) in enumerate(zip(q_lens, seq_lens.tolist())):
        first = max(0, seq_len - q_len - window + 1) // block_size
        for cache in (k_cache, v_cache):
            cache[block_tables[s, :first].long()] = float("nan")


def run_case(kernel, q_lens, seq_lens, group, head_dim, dtype, block_size, window, softcap, **launch):
    query, k_cache, v_cache, tables, lens, qsl = paged_inputs(q_lens, seq_lens, 2, group, head_dim,
                                                              block_size, dtype)
    scale = head_dim**-0.5
    if softcap:  # scores large enough for the cap to bite
        query = query * 4
    if window:
        poison_outside_windows(k_cache, v_cache, tables, q_lens, lens, window, block_size)
    want = paged_attention_ref(query, k_cache, v_cache, tables, lens, qsl, scale, sliding_window=window,
                               softcap=softcap)
    got = kernel(query, k_cache, v_cache, tables, lens, qsl, scale, sliding_window=window, softcap=softcap,
                 **launch)
    assert not got.isnan().any(), "a read outside the window, or an unwritten row"
    torch.testing.assert_close(got, want, **tolerance(dtype))
    if window and max(seq_lens) > window:  # the window changed the answer
        full = paged_attention_ref(query, k_cache.nan_to_num(), v_cache.nan_to_num(), tables, lens, qsl, scale,
                                   softcap=softcap)
        assert not torch.allclose(full, want, **tolerance(dtype))


@pytest.mark.parametrize(
    "group,head_dim,dtype,block_size,seq_lens,window,softcap,num_splits",
    [
        (1, 64, F32, 8, [5, 40, 70], 12, None, None),  # one sequence within the window, two past it
        (4, 64, BF16, 16, [33, 100], 20, None, 3),  # slices cut inside the window only
        (2, 64, F32, 4, [9, 64], None, 30.0, 2),  # soft-cap alone
        (4, 128, F32, 16, [50, 129], 17, 50.0, 1),  # both
    ],
)
def test_decode_window_and_softcap(group, head_dim, dtype, block_size, seq_lens, window, softcap, num_splits):
    run_case(paged_attention_decode, [1] * len(seq_lens), seq_lens, group, head_dim, dtype, block_size,
             window, softcap, max_seq_len=max(seq_lens), num_splits=num_splits)


@pytest.mark.parametrize(
    "group,head_dim,dtype,block_size,q_lens,seq_lens,window,softcap,block_m,block_n",
    [
        (1, 64, F32, 8, [40, 1, 9], [40, 30, 60], 12, None, None, None),  # fresh, decode row, extension
        (4, 64, BF16, 16, [33, 20], [33, 90], 7, None, 16, 16),  # window under one tile
        (2, 64, F32, 4, [30], [30], 40, 20.0, 16, 32),  # window longer than the prompt; capped
        (4, 128, F32, 16, [64, 17], [80, 17], 25, 50.0, 32, 16),  # unmasked tiles between two masked runs
    ],
)
def test_prefill_window_and_softcap(group, head_dim, dtype, block_size, q_lens, seq_lens, window, softcap,
                                    block_m, block_n):
    run_case(paged_attention_prefill, q_lens, seq_lens, group, head_dim, dtype, block_size, window, softcap,
             max_query_len=max(q_lens), block_m=block_m, block_n=block_n)
