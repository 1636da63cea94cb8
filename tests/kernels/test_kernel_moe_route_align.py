"""The MoE routing kernel and the expert-grouping kernels against their torch references, under
TRITON_INTERPRET=1."""

import pytest
import torch

from pagoda.kernels.fused_moe_ref import align_by_expert_ref, route_ref
from pagoda.kernels.moe_align import align_by_expert
from pagoda.kernels.moe_route import moe_route


@pytest.mark.parametrize(
    "num_tokens,num_experts,top_k,renormalize,dtype",
    [
        (1, 8, 2, True, torch.float32),  # Mixtral's shape, one decode token
        (37, 128, 8, True, torch.bfloat16),  # Qwen3-MoE's; tokens not a multiple of the block
        (5, 6, 3, False, torch.float16),  # experts not a power of two; no renormalisation
        (3, 4, 4, True, torch.float32),  # every expert picked
    ],
)
def test_route_picks_the_reference_experts_and_weights(num_tokens, num_experts, top_k, renormalize, dtype):
    logits = torch.randn(num_tokens, num_experts).to(dtype)
    weights, ids = moe_route(logits, top_k, renormalize)
    want_weights, want_ids = route_ref(logits, top_k, renormalize)
    assert ids.dtype == torch.int64 and weights.dtype == dtype
    # 16-bit logits tie often (128 experts, few distinct values): any expert among equals is right,
    # so hold the picked experts' probabilities to the reference's top k, in order
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    assert torch.equal(probs.gather(1, ids), probs.gather(1, want_ids))
    assert all(len(set(row)) == top_k for row in ids.tolist())
    if dtype == torch.float32:  # no ties: the very same experts
        assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights, rtol=1e-6 if dtype == torch.float32 else 1e-2, atol=1e-6)


def test_route_breaks_exact_ties_toward_the_lower_expert():
    logits = torch.tensor([[0.5, 2.0, 2.0, 2.0, -1.0]])
    weights, ids = moe_route(logits, 2, renormalize=True)
    assert ids.tolist() == [[1, 2]]
    torch.testing.assert_close(weights, torch.tensor([[0.5, 0.5]]))


def test_route_of_no_tokens():
    weights, ids = moe_route(torch.zeros(0, 8), 2, renormalize=True)
    assert weights.shape == ids.shape == (0, 2)


def _runs(sorted_pairs, block_expert, block_m):
    """{expert: sorted pair ids of its run}, and where the sentinel padding sits."""
    runs = {}
    for b, expert in enumerate(block_expert.tolist()):
        if expert >= 0:
            runs.setdefault(expert, []).extend(sorted_pairs[b * block_m : (b + 1) * block_m].tolist())
    return {e: sorted(v) for e, v in runs.items()}


@pytest.mark.parametrize(
    "num_tokens,top_k,num_experts,block_m,used",
    [
        (1, 2, 4, 16, None),  # decode: two pairs, two runs
        (7, 2, 5, 16, [0, 3]),  # experts 1, 2 and 4 empty: no tile of theirs
        (300, 8, 128, 16, None),  # a 256-seat decode of Qwen3-MoE's shape, more pairs than a chunk
        (64, 4, 6, 32, [5]),  # every pair to the last expert: runs longer than a tile
    ],
)
def test_align_groups_pairs_as_the_reference_does(num_tokens, top_k, num_experts, block_m, used):
    if used is None:
        ids = torch.stack([torch.randperm(num_experts)[:top_k] for _ in range(num_tokens)])
    else:
        ids = torch.tensor(used)[torch.randint(0, len(used), (num_tokens, top_k))]
    got_pairs, got_blocks = align_by_expert(ids, num_experts, block_m)
    want_pairs, want_blocks = align_by_expert_ref(ids, num_experts, block_m)
    # the same shapes, tiles and padding; within one expert's run the order is the atomics'
    assert got_pairs.shape == want_pairs.shape and got_pairs.dtype == want_pairs.dtype == torch.int32
    assert torch.equal(got_blocks, want_blocks)
    num_pairs = ids.numel()
    assert torch.equal(got_pairs == num_pairs, want_pairs == num_pairs)
    assert _runs(got_pairs, got_blocks, block_m) == _runs(want_pairs, want_blocks, block_m)
    real = got_pairs[got_pairs < num_pairs]
    assert sorted(real.tolist()) == list(range(num_pairs))


def test_tuned_tile_takes_the_nearest_measured_count(monkeypatch):
    from pagoda.kernels import moe_tiles

    key = moe_tiles.shape_key(128, 2048, 768, torch.bfloat16)
    table = {"GPU X": {key: {"64": [16, 64, 128, 4, 3], "1024": [64, 128, 64, 8, 4]}}}
    monkeypatch.setattr(moe_tiles, "_table", lambda: table)
    monkeypatch.setattr(moe_tiles, "_device_name", lambda index: "GPU X")
    cuda = torch.device("cuda", 0)
    assert moe_tiles.tuned_tile(100, 128, 2048, 768, torch.bfloat16, cuda)["block_m"] == 16
    assert moe_tiles.tuned_tile(900, 128, 2048, 768, torch.bfloat16, cuda) == dict(
        block_m=64, block_n=128, block_k=64, num_warps=8, num_stages=4)
    # another shape, dtype or GPU, and the CPU: nothing measured, the caller's first guesses
    assert moe_tiles.tuned_tile(100, 64, 2048, 768, torch.bfloat16, cuda) is None
    assert moe_tiles.tuned_tile(100, 128, 2048, 768, torch.float8_e4m3fn, cuda) is None
    assert moe_tiles.tuned_tile(100, 128, 2048, 768, torch.bfloat16, torch.device("cpu")) is None
    monkeypatch.setattr(moe_tiles, "_device_name", lambda index: "GPU Y")
    assert moe_tiles.tuned_tile(100, 128, 2048, 768, torch.bfloat16, cuda) is None
