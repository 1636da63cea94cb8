"""--l2-prefetch's choice of what to read ahead (runtime/quantization/fp8_prefetch.py): o_proj's
weight whole, the head of each half of gate_up's, in whole chunks, and only for a one-token forward
on the GPU with the switch on. The prefetch itself (the rotary launch's extra programs) is a GPU
instruction the interpreter lacks: e2e/gpu_prefetch_check.py checks there that the tokens and
logprobs keep their bits with it, under graphs and eager."""

import pytest
import torch
from torch import nn

from pagoda.kernels import ops
from pagoda.runtime.quantization import fp8_prefetch

CHUNK = fp8_prefetch.CHUNK


class GateUp(nn.Module):
    def __init__(self, inter, k):
        super().__init__()
        self.output_sizes = [inter, inter]
        self.weight = torch.arange(2 * inter * k, dtype=torch.int32).remainder(251).to(torch.uint8).view(2 * inter, k)


def test_the_chunk_is_the_kernels():
    l2_prefetch = pytest.importorskip("pagoda.kernels.l2_prefetch")
    assert fp8_prefetch.CHUNK == l2_prefetch.CHUNK


def test_gate_up_regions_are_the_head_of_each_half(monkeypatch):
    layer = GateUp(inter=64, k=CHUNK // 4)  # four rows a chunk
    monkeypatch.setattr(ops, "L2_PREFETCH_MLP_BYTES", 2 * 8 * layer.weight.shape[1])  # eight rows of each half
    gate, up = fp8_prefetch.regions(layer)
    assert torch.equal(gate, layer.weight[:8].reshape(-1)) and torch.equal(up, layer.weight[64:72].reshape(-1))
    monkeypatch.setattr(ops, "L2_PREFETCH_MLP_BYTES", 2 * 7 * layer.weight.shape[1])  # seven rows: cut to four
    gate, up = fp8_prefetch.regions(layer)
    assert gate.numel() == up.numel() == CHUNK and torch.equal(up, layer.weight[64:68].reshape(-1))
    monkeypatch.setattr(ops, "L2_PREFETCH_MLP_BYTES", 1 << 30)  # never past a half
    gate, up = fp8_prefetch.regions(layer)
    assert gate.numel() == up.numel() == 64 * layer.weight.shape[1]
    monkeypatch.setattr(ops, "L2_PREFETCH_MLP_BYTES", 0)
    assert fp8_prefetch.regions(layer) == []


def test_a_plain_layer_is_read_whole_in_whole_chunks():
    layer = nn.Module()
    layer.weight = torch.zeros(3 * CHUNK + 5, dtype=torch.uint8)
    (region,) = fp8_prefetch.regions(layer)
    assert region.numel() == 3 * CHUNK and region.data_ptr() == layer.weight.data_ptr()
    layer.weight = torch.zeros(CHUNK - 1, dtype=torch.uint8)  # less than a chunk: nothing to read
    assert fp8_prefetch.regions(layer) == []


def test_only_a_one_token_gpu_forward_with_the_switch_prefetches(monkeypatch):
    module = nn.Module()
    layer = nn.Module()
    layer.weight = torch.zeros(2 * CHUNK, dtype=torch.uint8)
    module.l2_prefetch_layers = (layer,)
    monkeypatch.setattr(ops, "L2_PREFETCH", True)
    assert fp8_prefetch.regions_for(module, torch.zeros(1, 4, 8)) is None  # the CPU: no rotary launch
    monkeypatch.setattr(ops, "L2_PREFETCH", False)
    assert fp8_prefetch.regions_for(module, torch.zeros(1, 4, 8)) is None
    assert fp8_prefetch.regions_for(nn.Module(), torch.zeros(1, 4, 8)) is None  # nothing linked


def test_link_gives_the_attention_only_fp8_gpu_layers():
    from pagoda.runtime.models.llama import LlamaDecoderLayer

    assert LlamaDecoderLayer.fp8_l2_prefetch[0] == "self_attn.attn"

    class Layer(nn.Module):
        fp8_l2_prefetch = ("attn", ("o_proj", "mlp.gate_up_proj"))

        def __init__(self):
            super().__init__()
            self.attn = nn.Module()
            self.o_proj = nn.Linear(8, 8, bias=False)
            self.o_proj.fp8 = None  # not an FP8 layer; and mlp is absent

    layer = Layer()
    fp8_prefetch.link(layer)
    assert not hasattr(layer.attn, "l2_prefetch_layers")
