"""Helpers shared by the kernel tests (imported by bare name: tests/kernels is on sys.path)."""

import torch


def tolerance(dtype: torch.dtype) -> dict:
    """assert_close tolerances: a couple of ulps of the output dtype (the interpreter rounds
    float32 to bfloat16 by truncation, so bf16 may sit one ulp off the reference)."""
    return {
        torch.float32: dict(rtol=1e-5, atol=1e-5),
        torch.float16: dict(rtol=2e-3, atol=2e-3),
        torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2),
    }[dtype]


def paged_inputs(q_lens, seq_lens, num_kv_heads, group, head_dim, block_size, dtype):
    """Random packed queries and a paged KV cache whose blocks are scattered at random.

    Every cache slot no sequence owns (spare blocks, the tail of each last block) holds NaN, and
    the unused block-table columns point at a NaN block, so a kernel that reads past seq_len
    poisons its output instead of passing by luck.
    """
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 2
    k_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    v_cache = k_cache.clone()
    order = torch.randperm(num_blocks - 1)  # the last block stays NaN for the spare columns
    block_tables = torch.full((len(seq_lens), max(blocks_per_seq) + 1), num_blocks - 1, dtype=torch.int32)
    used = 0
    for s, (seq_len, n) in enumerate(zip(seq_lens, blocks_per_seq)):
        block_tables[s, :n] = order[used : used + n].int()
        used += n
        for cache in (k_cache, v_cache):
            flat = cache[block_tables[s, :n].long()].view(-1, num_kv_heads, head_dim)
            flat[:seq_len] = torch.randn(seq_len, num_kv_heads, head_dim).to(dtype)
            cache[block_tables[s, :n].long()] = flat.view(n, block_size, num_kv_heads, head_dim)
    query = torch.randn(sum(q_lens), num_kv_heads * group, head_dim).to(dtype)
    query_start_loc = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor(seq_lens, dtype=torch.int32)
    return query, k_cache, v_cache, block_tables, seq_lens, query_start_loc


def pairwise(**axes) -> dict:
    """parametrize() arguments for a covering set of the axes' cross product: every value of every
    axis, and every pair of values of any two axes, meets in at least one case. A kernel bug that
    needs one value, or two at once (a dtype with a split-K config, a row count with a masked
    tail), is still met; under the interpreter the full product of four axes costs several times
    the time for cases that add no pair. Each axis is a list, or a dict of id -> value. Greedy and
    deterministic: the case that covers the most uncovered pairs, the first such in product order."""
    import itertools

    import pytest

    named = {a: v if isinstance(v, dict) else {_id(x): x for x in v} for a, v in axes.items()}
    keys = [list(v) for v in named.values()]  # each axis by its ids
    def pairs(case):
        return {(i, case[i], j, case[j]) for i, j in itertools.combinations(range(len(case)), 2)}
    uncovered = set().union(*(pairs(c) for c in itertools.product(*keys)))
    chosen = []
    while uncovered:
        best = max(itertools.product(*keys), key=lambda c: len(pairs(c) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    values = list(named.values())
    return dict(argnames=",".join(named), argvalues=[
        pytest.param(*(values[i][k] for i, k in enumerate(case)), id="-".join(case)) for case in chosen])


def _id(value) -> str:
    return str(value).removeprefix("torch.")
