"""W3's TPOT roofline: the formula on round numbers, the committed H100 run against it, and the
keys `bench serve` adds to each rate entry."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_bench_serve_stub import _bench, make_stub

from pagoda.runtime.memory import count_parameters
from pagoda.runtime.tools.bench import workloads
from pagoda.runtime.tools.bench.roofline import serving_tpot_roofline_ms

W1 = workloads.LLAMA_3_1_8B
H100_W3 = Path(__file__).parents[2] / "e2e/results/peer-da25bbe/w3/W3-pagoda-20261206-195140.json"
# Llama-3.1-8B's KV cache: K and V, 32 layers, 8 heads of 128, two bytes each.
W1_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2


def rate_entry(request_throughput=10.0, decode_ms=2000.0, prompt_tokens=50_000, duration_s=10.0) -> dict:
    """100 requests of 500 prompt and 200 output tokens on average."""
    return {"completed": 100, "duration_s": duration_s, "request_throughput": request_throughput,
            "prompt_tokens": prompt_tokens, "output_tokens": 20_000,
            "ttft_ms_mean": 50.0, "e2e_ms_mean": 50.0 + decode_ms}


def test_memory_bound_step_by_hand():
    """B = 10 req/s * 2 s = 20 decoding; context 500 + 200/2 = 600; prefill 5,000 tok/s."""
    params = count_parameters(W1)  # checked against transformers in test_bench_workloads.py
    flops, bandwidth = 1000e12, 2e12
    roof = serving_tpot_roofline_ms(W1, rate_entry(), tflop_per_s=1000.0, tb_per_s=2.0)
    assert roof["decoding_requests"] == pytest.approx(20.0)
    assert roof["mean_context"] == 600.0
    prefill_share = 5000 * 2 * params / flops
    assert roof["prefill_share"] == pytest.approx(prefill_share)
    # 20 * 2P FLOPs take far less than reading 2P bytes: the weights' read sets the step.
    step_s = 2 * params / bandwidth + 20 * 600 * W1_KV_BYTES_PER_TOKEN / bandwidth
    assert roof["step_ms"] == pytest.approx(step_s * 1e3)
    assert roof["tpot_roofline_ms"] == pytest.approx(step_s / (1 - prefill_share) * 1e3)
    assert not roof["prefill_saturates"]


def test_compute_bound_step_and_saturated_prefill():
    params = count_parameters(W1)
    # 600 decoding (10 req/s for 60 s each) > FLOPS / BW = 500: the matmuls outlast the weights' read.
    roof = serving_tpot_roofline_ms(W1, rate_entry(decode_ms=60_000.0), tflop_per_s=1000.0, tb_per_s=2.0)
    step_s = 600 * 2 * params / 1000e12 + 600 * 600 * W1_KV_BYTES_PER_TOKEN / 2e12
    assert roof["step_ms"] == pytest.approx(step_s * 1e3)
    # Prompts arriving faster than the matmul ceiling can prefill them leave no time to decode.
    flood = serving_tpot_roofline_ms(W1, rate_entry(prompt_tokens=50_000_000), tflop_per_s=1000.0, tb_per_s=2.0)
    assert flood["prefill_share"] > 1 and flood["prefill_saturates"] and flood["tpot_roofline_ms"] == math.inf


def test_committed_h100_run_is_above_the_h200_roofline():
    """The H100's W3 run at 16 req/s, held to the H200's ceilings: a limit it cannot beat on an H100."""
    rate = json.loads(H100_W3.read_text())["rates"][0]
    roof = serving_tpot_roofline_ms(W1, rate, tflop_per_s=780.0, tb_per_s=4.25)
    assert math.isfinite(roof["tpot_roofline_ms"])
    assert 3.78 < roof["tpot_roofline_ms"] < rate["tpot_ms_p50"]  # above W2's floor: KV and prefill add
    assert 30 < roof["decoding_requests"] < 50 and 0 < roof["prefill_share"] < 0.5


def test_serve_adds_the_roofline_for_a_known_gpu(serve_app, tmp_path):
    app, _ = make_stub()
    with serve_app(app) as url:
        _, known = _bench(url, tmp_path / "h200", "--request-rate", "inf", "--gpu", "H200")
        _, skipped = _bench(url, tmp_path / "none", "--request-rate", "inf", "--gpu", "H200",
                            "--roofline-model", "none")
        _, unknown = _bench(url, tmp_path / "other", "--request-rate", "inf", "--gpu", "Some GPU")
    (rate,) = known["rates"]
    roof = serving_tpot_roofline_ms(W1, rate, tflop_per_s=780.0, tb_per_s=4.25)
    assert rate["tpot_roofline_ms"] == pytest.approx(roof["tpot_roofline_ms"])
    assert rate["tpot_p50_to_roofline"] == pytest.approx(rate["tpot_ms_p50"] / roof["tpot_roofline_ms"])
    assert rate["tpot_roofline"]["gpu"] == "NVIDIA H200" and rate["tpot_roofline"]["model"] == "w1"
    for record in (skipped, unknown):
        assert not {"tpot_roofline", "tpot_roofline_ms", "tpot_p50_to_roofline"} & set(record["rates"][0])
