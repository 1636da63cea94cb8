"""The ceilings of the card that ran: the table's lookup, the roofline drawn with them, and the
this-GPU keys `bench throughput` and `bench latency` add (CPU runs of the tiny model)."""

from __future__ import annotations

import json

import pytest
import torch

from pagoda.runtime.cli import main
from pagoda.runtime.tools.bench import ceilings, results, workloads
from pagoda.runtime.tools.bench.ceilings import GPU_CEILINGS, GpuCeilings, ceilings_for
from pagoda.runtime.tools.bench.roofline import decode_floor_ms, offline_roofline

THIS_GPU_KEYS = ("this_gpu_ceilings", "this_gpu_roofline_output_tokens_per_s", "ratio_to_this_gpu_roofline",
                 "this_gpu_floor_ms", "ratio_to_this_gpu_floor")
# A card with half the H200's ceilings, so every this-GPU figure has an exact expected value.
HALF_CARD = GpuCeilings("Test Card 80GB", 390.0, 2.125, "test table")


def test_lookup_is_exact_or_by_alias():
    h200 = ceilings_for("NVIDIA H200")
    assert (h200.tflop_per_s, h200.tb_per_s) == (780.0, 4.25) and "BENCHMARKS.md" in h200.source
    assert ceilings_for("H200") is h200 and ceilings_for(" NVIDIA H200\n") is h200
    # Variants share a prefix, not ceilings: none of them borrows the H200's.
    for other in ("NVIDIA H200 NVL", "NVIDIA H200 MIG 1g.18gb", "NVIDIA H20", "nvidia h200", "cpu", ""):
        assert ceilings_for(other) is None, other
    assert all(c.gpu == name for name, c in GPU_CEILINGS.items())
    assert all(target in GPU_CEILINGS for target in ceilings.ALIASES.values())


@pytest.mark.parametrize("name", ["w1", "w5"])
@pytest.mark.parametrize("fp8", [False, True])
def test_roofline_scales_with_the_ceilings(name, fp8):
    """Prefill is bound by the matmul ceiling only, decode by the copy bandwidth only."""
    config = workloads.MODEL_CONFIGS[name]
    lens = [len(r.prompt_token_ids) for r in workloads.w1_requests()]

    def roof(tflop, tb):
        return offline_roofline(config, lens, 256, tflop_per_s=tflop, tb_per_s=tb, fp8_weights=fp8,
                                kv_dtype_bytes=1 if fp8 else None)

    base, slow_copy, slow_matmul = roof(780.0, 4.25), roof(780.0, 2.125), roof(390.0, 4.25)
    assert slow_copy.decode_s == pytest.approx(2 * base.decode_s, rel=1e-12)
    assert slow_copy.prefill_s == base.prefill_s
    assert slow_matmul.prefill_s == pytest.approx(2 * base.prefill_s, rel=1e-12)
    assert slow_matmul.decode_s == base.decode_s
    assert roof(390.0, 2.125).output_tokens_per_s == pytest.approx(base.output_tokens_per_s / 2, rel=1e-12)


def _bench(tmp_path, monkeypatch, command: list[str], *extra: str) -> dict:
    monkeypatch.setenv("PAGODA_BENCH_CACHE", str(tmp_path / "models"))
    out = tmp_path / "results"
    assert main(["bench", *command, "--model", "tiny", "--out", str(out), *extra]) == 0
    (path,) = out.glob("W*.json")
    return json.loads(path.read_text())


THROUGHPUT = ["throughput", "--num-prompts", "3", "--output-len", "4", "--warmup-prompts", "1",
              "--warmup-tokens", "2", "--max-model-len", "1100"]
LATENCY = ["latency", "--output-len", "5", "--warmup-iters", "1", "--iters", "2"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU run: on CUDA --measure-ceilings measures")
@pytest.mark.parametrize("command", [THROUGHPUT, LATENCY], ids=["throughput", "latency"])
def test_cpu_run_has_no_this_gpu_keys(command, tmp_path, monkeypatch, capsys):
    record = _bench(tmp_path, monkeypatch, command, "--measure-ceilings")
    assert record["gpu"] == "cpu" and "--measure-ceilings" in record["command"]
    assert not [k for k in THIS_GPU_KEYS if k in record]
    assert "no CUDA device in this run, nothing measured" in capsys.readouterr().out


def _on_half_card(monkeypatch):
    monkeypatch.setitem(GPU_CEILINGS, HALF_CARD.gpu, HALF_CARD)
    monkeypatch.setattr(results, "gpu_name", lambda: HALF_CARD.gpu)


def test_throughput_on_a_known_card(tmp_path, monkeypatch, capsys):
    _on_half_card(monkeypatch)
    record = _bench(tmp_path, monkeypatch, THROUGHPUT)
    assert record["gpu"] == HALF_CARD.gpu
    assert record["this_gpu_ceilings"] == {"gpu": "Test Card 80GB", "tflop_per_s": 390.0, "tb_per_s": 2.125,
                                           "source": "test table"}
    lens = [len(r.prompt_token_ids) for r in workloads.w1_requests()[:3]]
    own = offline_roofline(workloads.MODEL_CONFIGS["tiny"], lens, 4, tflop_per_s=390.0, tb_per_s=2.125)
    assert record["this_gpu_roofline_output_tokens_per_s"] == pytest.approx(own.output_tokens_per_s, rel=1e-12)
    # Half of both ceilings: half the H200 roofline, so twice the ratio; the H200 keys stay as they were.
    assert record["this_gpu_roofline_output_tokens_per_s"] == pytest.approx(
        record["roofline_output_tokens_per_s"] / 2, rel=1e-12)
    assert record["ratio_to_this_gpu_roofline"] == pytest.approx(2 * record["ratio_to_roofline"], rel=1e-12)
    assert record["roofline"]["tb_per_s"] == 4.25
    assert "on Test Card 80GB's own ceilings" in capsys.readouterr().out


def test_latency_on_a_known_card(tmp_path, monkeypatch):
    _on_half_card(monkeypatch)
    record = _bench(tmp_path, monkeypatch, LATENCY)
    assert record["this_gpu_ceilings"]["tb_per_s"] == 2.125
    assert record["this_gpu_floor_ms"] == pytest.approx(
        decode_floor_ms(workloads.MODEL_CONFIGS["tiny"], tb_per_s=2.125), rel=1e-12)
    assert record["this_gpu_floor_ms"] == pytest.approx(2 * record["floor_ms"], rel=1e-12)
    assert record["ratio_to_this_gpu_floor"] == pytest.approx(record["tpot_ms_p50"] / record["this_gpu_floor_ms"])
