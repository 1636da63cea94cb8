"""kernels/l2_prefetch.py reads every word of what it prefetches exactly where its grid says, and
runtime/quantization/fp8_prefetch.py picks the right weights and takes only one-token FP8 forwards.
The side stream's effect (the same bits with and without, under graphs) is e2e/gpu_prefetch_check.py's,
on the GPU: the CPU has no streams."""

from functools import reduce

import numpy as np
import pytest
import torch
from torch import nn

from pagoda.kernels import l2_prefetch, ops
from pagoda.kernels.quant_fp8_ref import FP8_DTYPE
from pagoda.runtime.quantization import fp8_prefetch


def xor_of(words: np.ndarray) -> int:
    return int(reduce(np.bitwise_xor, words, np.int32(0))) if words.size else 0


@pytest.mark.parametrize("rows, cols, programs, block", [(24, 64, 4, 64), (7, 36, 3, 32), (1, 4, 4, 16)])
def test_each_program_reads_its_span_once(rows, cols, programs, block):
    w = (torch.randn(rows, cols) * 3).to(FP8_DTYPE)
    sink = torch.full((programs,), -1, dtype=torch.int32)
    l2_prefetch.prefetch(w, sink, programs=programs, block=block, num_warps=1)
    words = l2_prefetch.words(w).numpy()
    span = -(-(-(-words.size // programs)) // block) * block
    used = -(-words.size // span)
    for pid in range(used):  # a word read twice, or missed, would change its program's xor
        assert int(sink[pid]) == xor_of(words[pid * span:(pid + 1) * span]), pid
    assert (sink[used:] == -1).all()  # no program past the grid


def test_a_row_slice_reads_only_those_rows():
    w = (torch.randn(16, 32) * 3).to(FP8_DTYPE)
    sink = torch.zeros(4, dtype=torch.int32)
    l2_prefetch.prefetch(w[4:6], sink, programs=1, block=16, num_warps=1)
    assert int(sink[0]) == xor_of(l2_prefetch.words(w[4:6]).numpy())


def test_words_rejects_a_tensor_that_is_not_whole_words():
    with pytest.raises(AssertionError, match="whole words"):
        l2_prefetch.words(torch.zeros(3, dtype=torch.uint8))


class GateUp(nn.Module):
    def __init__(self, inter, k):
        super().__init__()
        self.output_sizes = [inter, inter]
        self.weight = torch.arange(2 * inter * k, dtype=torch.int32).remainder(251).to(torch.uint8).view(2 * inter, k)


def test_gate_up_regions_are_the_head_of_each_half(monkeypatch):
    layer = GateUp(inter=64, k=32)
    monkeypatch.setattr(ops, "L2_PREFETCH_MLP_BYTES", 2 * 10 * 32)  # ten rows of each half
    gate, up = fp8_prefetch.regions(layer)
    assert torch.equal(gate, layer.weight[:10]) and torch.equal(up, layer.weight[64:74])
    monkeypatch.setattr(ops, "L2_PREFETCH_MLP_BYTES", 1 << 30)  # never past a half
    gate, up = fp8_prefetch.regions(layer)
    assert gate.shape[0] == up.shape[0] == 64
    monkeypatch.setattr(ops, "L2_PREFETCH_MLP_BYTES", 0)
    assert fp8_prefetch.regions(layer) == []


def test_a_plain_layer_is_read_whole():
    layer = nn.Linear(8, 4, bias=False)
    (region,) = fp8_prefetch.regions(layer)
    assert region is layer.weight


def test_ahead_takes_only_one_token_on_the_gpu_with_the_switch(monkeypatch):
    module = nn.Module()
    module.l2_prefetch_layers = (nn.Linear(8, 4, bias=False),)
    monkeypatch.setattr(ops, "L2_PREFETCH", True)
    assert fp8_prefetch.ahead(module, torch.zeros(1, 4)) is False  # a CPU tensor: nothing to read ahead
    monkeypatch.setattr(ops, "L2_PREFETCH", False)
    assert fp8_prefetch.ahead(module, torch.zeros(1, 4)) is False


def test_link_leaves_layers_that_are_not_fp8_alone():
    from pagoda.runtime.models.llama import LlamaDecoderLayer

    assert LlamaDecoderLayer.fp8_l2_prefetch[0] == "self_attn"

    class Layer(nn.Module):
        fp8_l2_prefetch = ("attn", ("attn.o_proj", "mlp.gate_up_proj"))

        def __init__(self):
            super().__init__()
            self.attn = nn.Module()
            self.attn.o_proj = nn.Linear(8, 8, bias=False)  # bf16-style weights: no FP8 scheme
            self.attn.o_proj.fp8 = None

    layer = Layer()
    fp8_prefetch.link(layer)
    assert not hasattr(layer.attn, "l2_prefetch_layers")
