"""--fold-rope-kv (ops.FOLD_ROPE_KV): at one decode row the Llama attention block takes its rotated
query from qkv_proj's kernel (kernels/gemv_rope.py), which has written the row's key and value to the
cache, and rotary_kv_cache does not run. The block's output and the cache must be the same bits as
with the fold off (the GEMV, then rotary_kv_cache), for bf16 and FP8 weights and caches; other row
counts keep the two kernels. On the CPU with the dispatcher taking CPU tensors for CUDA ones (the
kernels interpreted), as test_fp8_gemv_folds.py does."""

from types import SimpleNamespace

import pytest
import torch

from pagoda.kernels import fp8_dispatch, ops
from pagoda.kernels import gemv as gemv_module
from pagoda.kernels import gemv_rope as rope_module
from pagoda.kernels import rotary_kv_cache as rotary_module
from pagoda.kernels.fp8_dispatch import Fp8Launch
from pagoda.kernels.gemv import GemvConfig
from pagoda.runtime.layers.rotary import RotaryEmbedding
from pagoda.runtime.models.llama import LlamaAttention
from pagoda.runtime.quantization import fp8_linear
from pagoda.runtime.quantization.scheme import FP8Scheme
from pagoda.runtime.worker.attention_context import AttentionContext, attention_context

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, BLOCK, BLOCKS = 64, 4, 2, 16, 4, 4
QKV = (HEADS + 2 * KV_HEADS) * HEAD_DIM
LAUNCH = GemvConfig(block_n=4, block_k=32, split_k=1, num_warps=4, fold=8)
DTYPE = torch.bfloat16
FP8 = torch.float8_e4m3fn


@pytest.fixture
def kernels(monkeypatch):
    """CPU tensors taken for CUDA ones, FP8 kept as on an FP8 GPU, measured one-row launches for the
    tiny shapes, and a record of which of the two paths ran."""
    monkeypatch.setattr(ops, "_on_gpu", lambda t: True)
    monkeypatch.setattr(fp8_linear, "has_fp8_matmul", lambda device: True)
    entries = {(1, QKV, HIDDEN, None): LAUNCH, (1, HIDDEN, HIDDEN, None): LAUNCH}
    monkeypatch.setattr(fp8_dispatch, "FP8_SMALL_M", {key: Fp8Launch("gemv", c) for key, c in entries.items()})
    monkeypatch.setattr(gemv_module, "FASTER_THAN_CUBLAS", entries)
    calls = []
    fold, rotary = rope_module.gemv_rope_kv, rotary_module.rotary_kv_cache
    monkeypatch.setattr(rope_module, "gemv_rope_kv", lambda *a, **kw: calls.append("gemv_rope_kv") or fold(*a, **kw))
    monkeypatch.setattr(rotary_module, "rotary_kv_cache", lambda *a, **kw: calls.append("rotary_kv_cache")
                        or rotary(*a, **kw))
    return calls


def attention_block(fp8: bool, bias: bool, cache_dtype: torch.dtype) -> LlamaAttention:
    cfg = SimpleNamespace(hidden_size=HIDDEN, head_dim=HEAD_DIM, num_heads=HEADS, num_kv_heads=KV_HEADS,
                          qkv_bias=bias, hf_config={"num_hidden_layers": 1})
    block = LlamaAttention(cfg, 0, RotaryEmbedding(HEAD_DIM, 64, 10000.0))
    for layer in (block.qkv_proj, block.o_proj):
        layer.weight.data = (torch.randn(layer.weight.shape) / HIDDEN**0.5).to(DTYPE)
        if fp8:
            fp8_linear.finish_loading(layer, FP8Scheme(source="online", serialized=False,
                                                       activations="dynamic-token"), DTYPE)
    if bias:
        block.qkv_proj.bias.data = (0.1 * torch.randn(QKV)).to(DTYPE)
    # six cached positions of the sequence, the row at position 6 goes to slot 6
    cache = (torch.randn(2, BLOCKS, BLOCK, KV_HEADS, HEAD_DIM) * 0.5).to(cache_dtype)
    block.attn.k_cache, block.attn.v_cache = cache[0].clone(), cache[1].clone()
    if cache_dtype == FP8:
        block.attn.k_scale, block.attn.v_scale = 0.05, 0.02
    return block


def decode(block: LlamaAttention, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of `rows` sequences at one row each over the block's cache (one block table each)."""
    positions = torch.arange(6, 6 + rows)
    ctx = AttentionContext(
        slot_mapping=torch.tensor([6 + 5 * i for i in range(rows)]),
        block_tables=torch.tensor([[0, 1]] + [[2, 3]] * (rows - 1), dtype=torch.int32),
        seq_lens=torch.full((rows,), 7, dtype=torch.int32), query_start_loc=torch.arange(rows + 1, dtype=torch.int32),
        max_query_len=1, max_seq_len=7,
    )
    k_cache, v_cache = block.attn.k_cache.clone(), block.attn.v_cache.clone()
    with attention_context(ctx):
        out = block(positions, torch.randn(rows, HIDDEN).to(DTYPE))
    written = block.attn.k_cache.clone(), block.attn.v_cache.clone()
    block.attn.k_cache, block.attn.v_cache = k_cache, v_cache  # as found, for the other run
    return out, *written


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16)


@pytest.mark.parametrize("fp8,bias,cache", [(False, False, DTYPE), (True, True, DTYPE), (True, False, FP8),
                                            (False, True, FP8)])
def test_one_row_takes_the_fold_with_the_same_bits(kernels, monkeypatch, fp8, bias, cache):
    block = attention_block(fp8, bias, cache)
    state = torch.random.get_rng_state()
    monkeypatch.setattr(ops, "FOLD_ROPE_KV", False)  # the two kernels first (--no-fold-rope-kv)
    want = decode(block, 1)
    assert kernels == ["rotary_kv_cache"]
    kernels.clear()
    monkeypatch.setattr(ops, "FOLD_ROPE_KV", True)
    torch.random.set_rng_state(state)  # the same hidden row
    got = decode(block, 1)
    assert kernels == ["gemv_rope_kv"]
    for a, b in zip(got, want):
        assert torch.equal(bits(a), bits(b))
    assert not torch.equal(bits(got[1]), bits(block.attn.k_cache))  # the row's key did land in the cache


def test_two_rows_and_unmeasured_shapes_keep_the_two_kernels(kernels, monkeypatch):
    monkeypatch.setattr(ops, "FOLD_ROPE_KV", True)
    block = attention_block(True, False, DTYPE)
    decode(block, 2)
    assert kernels == ["rotary_kv_cache"]
    kernels.clear()
    monkeypatch.setattr(fp8_dispatch, "FP8_SMALL_M", {})  # no measured launch for qkv: the usual path
    decode(block, 1)
    assert kernels == ["rotary_kv_cache"]


def test_a_rope_tile_of_its_own_takes_precedence_over_the_qkv_entry(kernels, monkeypatch):
    """fp8_dispatch.ROPE_KV_TILES (what --rope-sweep finds) gives the fold its launch; the plain
    projection keeps the FP8_SMALL_M entry's."""
    own = GemvConfig(block_n=2, block_k=16, split_k=1, num_warps=2, fold=1)
    assert fp8_dispatch.fused_rope_kv(QKV, HIDDEN, torch.device("cpu")) == LAUNCH
    monkeypatch.setattr(fp8_dispatch, "ROPE_KV_TILES", {(QKV, HIDDEN): own})
    assert fp8_dispatch.fused_rope_kv(QKV, HIDDEN, torch.device("cpu")) == own
    seen = []
    fold = rope_module.gemv_rope_kv
    monkeypatch.setattr(rope_module, "gemv_rope_kv", lambda *a, **kw: seen.append(kw["config"]) or fold(*a, **kw))
    monkeypatch.setattr(ops, "FOLD_ROPE_KV", True)
    decode(attention_block(True, False, DTYPE), 1)
    assert seen == [own]
