"""The GPU sampler against sample_ref under TRITON_INTERPRET=1: Philox bit for bit, every sampling
option, greedy tie-breaking, independence from the batch, and the law of the draws."""

import pytest
import torch
import triton
import triton.language as tl

from pagoda.kernels.sampling import logit_cutoffs, sample
from pagoda.kernels.sampling_ref import philox_uniform, sample_ref


@triton.jit
def _uniform_kernel(out_ptr, seed, step, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, tl.rand(seed, (step.to(tl.int64) << 32) + i.to(tl.int64)))


@pytest.mark.parametrize("seed,step", [(0, 0), (123456789123, 5), (-7, 2**31 + 3), (2**63 - 1, 1)])
def test_philox_reference_is_bit_exact_with_tl_rand(seed, step):
    got = torch.empty(256)
    _uniform_kernel[(1,)](got, seed, step, 256)
    want = philox_uniform(seed, step * 2**32 + torch.arange(256))
    assert torch.equal(got, want)
    assert 0.0 <= float(want.min()) and float(want.max()) < 1.0


def params(num_seqs, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    def full(v, dtype):
        return torch.full((num_seqs,), v, dtype=dtype) if not isinstance(v, list) else torch.tensor(v, dtype=dtype)

    return dict(
        temperature=full(temperature, torch.float32), top_k=full(top_k, torch.int32),
        top_p=full(top_p, torch.float32), min_p=full(min_p, torch.float32),
        seeds=torch.randint(-(2**62), 2**62, (num_seqs,)), steps=torch.randint(0, 5000, (num_seqs,)),
    )


@pytest.mark.parametrize("dtype,vocab", [(torch.float32, 2500), (torch.bfloat16, 777), (torch.float16, 1024)])
def test_sample_matches_reference_for_every_option(dtype, vocab):
    p = params(
        10,
        temperature=[0.0, 1.0, 0.7, 1.3, 0.5, 2.0, 1.0, 0.9, 1.0, 0.0],
        top_k=[0, 0, 5, 50, 0, vocab, 1, 20, -1, 3],
        top_p=[1.0, 1.0, 1.0, 0.8, 0.5, 0.9, 1.0, 0.3, 0.95, 0.5],
        min_p=[0.0, 0.0, 0.0, 0.0, 0.1, 0.05, 0.0, 0.2, 0.0, 0.5],
    )
    logits = (3 * torch.randn(10, vocab)).to(dtype)
    want = sample_ref(logits, **p)
    got = sample(logits, **p)
    assert got.dtype == torch.int64 and torch.equal(got, want)
    # the sort-free path agrees wherever no row asks for top-k or top-p
    plain = {**p, "top_k": torch.zeros(10, dtype=torch.int32), "top_p": torch.ones(10)}
    assert torch.equal(sample(logits, **plain, need_cutoffs=False), sample_ref(logits, **plain))


def test_greedy_takes_the_first_of_equal_maxima():
    logits = torch.randn(3, 3000)
    logits[0, [7, 2900]] = 50.0
    logits[1, [1100, 1024, 2047]] = 50.0  # ties across tiles and lanes
    logits[2, 0] = 50.0
    p = params(3, temperature=0.0)
    assert sample(logits, **p).tolist() == [7, 1024, 0]
    assert sample(logits, **p, all_greedy=True).tolist() == [7, 1024, 0]
    assert sample_ref(logits, **p).tolist() == [7, 1024, 0]


def test_a_seeded_row_ignores_the_rest_of_the_batch():
    logits = torch.randn(6, 900)
    p = params(6, temperature=[1.0, 0.8, 1.2, 0.0, 1.0, 1.5], top_k=[0, 30, 0, 0, 5, 0],
               top_p=[1.0, 0.9, 0.7, 1.0, 1.0, 1.0], min_p=[0.0, 0.0, 0.1, 0.0, 0.0, 0.0])
    together = sample(logits, **p)
    for rows in ([2], [4, 1], [5, 0, 3]):
        alone = sample(logits[rows], **{k: v[rows] for k, v in p.items()})
        assert alone.tolist() == together[rows].tolist()


def test_degenerate_cutoffs_leave_only_the_argmax():
    logits = torch.randn(3, 600)
    p = params(3, temperature=1.0, top_k=[1, 0, 0], top_p=[1.0, 1e-6, 1.0], min_p=[0.0, 0.0, 1.0])
    assert sample(logits, **p).tolist() == logits.argmax(-1).tolist()


def test_draws_follow_the_truncated_distribution():
    """One row of 6 logits under 3000 seeds, top_k=4, temperature 0.8: the two tokens outside the
    top 4 never come up and the rest come up at their renormalised odds. The law is checked on
    the reference (fast on the CPU); the kernel must then draw the same ids on a slice of seeds."""
    n = 3000
    logits = torch.tensor([[1.0, 0.2, -0.5, 2.0, 0.9, -3.0]]).repeat(n, 1)
    p = params(n, temperature=0.8, top_k=4)
    p["seeds"] = torch.arange(n)
    p["steps"] = torch.full((n,), 7)
    drawn = sample_ref(logits, **p)
    counts = torch.bincount(drawn, minlength=6).float()
    scaled = logits[0] / 0.8
    probs = torch.where(scaled >= scaled.topk(4).values[-1], scaled, float("-inf")).softmax(-1)
    assert counts[[2, 5]].sum() == 0
    assert (counts / n - probs).abs().max() < 0.027  # about three standard deviations
    rows = torch.arange(0, n, 50)
    assert torch.equal(sample(logits[rows], **{k: v[rows] for k, v in p.items()}), drawn[rows])


def test_logit_cutoffs():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0], [4.0, 3.0, 2.0, 1.0, 0.0]])
    temperature = torch.ones(2)
    cut = logit_cutoffs(logits, temperature, torch.tensor([2, 0]), torch.tensor([1.0, 0.7]), torch.zeros(2))
    # softmax of 4,3,2,1,0 is .636,.234,.086,...: the nucleus for 0.7 is the top two
    assert cut.tolist() == [3.0, 3.0]
    cut = logit_cutoffs(logits, temperature, torch.tensor([0, 5]), torch.tensor([1.0, 1.0]), torch.zeros(2))
    assert cut.tolist() == [float("-inf"), float("-inf")]
    # min-p first: with min_p 0.3 only 4 and 3 survive (.234 >= .3 * .636), and the nucleus for
    # 0.7 over the renormalised pair (.731, .269) is the top one alone (without min-p it is two)
    cut = logit_cutoffs(logits[:1], temperature[:1], torch.tensor([0]), torch.tensor([0.7]), torch.tensor([0.3]))
    assert cut.tolist() == [4.0]
