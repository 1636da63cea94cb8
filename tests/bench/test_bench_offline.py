"""Smoke runs of `pagoda bench throughput` and `pagoda bench latency` on a tiny dummy model (CPU),
for both backends: they run end to end and write complete result files."""

from __future__ import annotations

import json
import shlex

import pytest

from pagoda.runtime.cli import build_parser, main

ENV_KEYS = ("workload", "backend", "gpu", "commit", "torch", "triton", "command")


@pytest.fixture(autouse=True)
def bench_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGODA_BENCH_CACHE", str(tmp_path / "models"))


def _only_result(out, pattern: str) -> dict:
    (path,) = out.glob(pattern)
    record = json.loads(path.read_text())
    assert (out / record["plot"]).read_bytes()[:4] == b"\x89PNG"
    for key in ENV_KEYS:
        assert record[key], key
    return record


@pytest.mark.parametrize("backend", ["pagoda", "hf"])
def test_throughput_smoke(backend, tmp_path):
    out = tmp_path / "results"
    argv = ["bench", "throughput", "--backend", backend, "--model", "tiny", "--num-prompts", "3",
            "--output-len", "4", "--warmup-prompts", "1", "--warmup-tokens", "2", "--hf-batch-size", "2",
            "--max-model-len", "1100", "--out", str(out)]
    assert main(argv) == 0
    record = _only_result(out, f"W1-{backend}-*.json")
    assert record["output_tokens"] == 3 * 4 and record["num_prompts"] == 3 and record["capped"] is True
    assert record["output_tokens_per_s"] == pytest.approx(record["output_tokens"] / record["elapsed_s"])
    assert 0 < record["ratio_to_roofline"] < 1
    assert record["roofline"]["prompt_tokens"] == record["prompt_tokens"] > 3 * 128
    # The recorded command is complete: parsed again, it gives the same flags.
    words = shlex.split(record["command"])
    assert words[:3] == ["pagoda", "bench", "throughput"]
    again = vars(build_parser("bench").parse_args(words[1:]))
    first = vars(build_parser("bench").parse_args(argv))
    assert {k: v for k, v in again.items() if k != "_parser"} == {k: v for k, v in first.items() if k != "_parser"}


@pytest.mark.parametrize("backend", ["pagoda", "hf"])
def test_latency_smoke(backend, tmp_path):
    out = tmp_path / "results"
    argv = ["bench", "latency", "--backend", backend, "--model", "tiny", "--output-len", "5",
            "--warmup-iters", "1", "--iters", "2", "--out", str(out)]
    assert main(argv) == 0
    record = _only_result(out, f"W2-{backend}-*.json")
    assert record["prompt_len"] == 128 and record["output_tokens_per_run"] == [5, 5]
    assert record["num_decode_steps"] == 2 * 4 and len(record["step_ms"]) == 4
    assert 0 < record["tpot_ms_min"] <= record["tpot_ms_p50"] <= record["tpot_ms_p90"]
    assert record["ttft_ms_p50"] < record["e2e_ms_p50"]
    assert record["ratio_to_floor"] > 1


def test_recorded_command_keeps_engine_switches():
    """Engine switches (--gemm-glu / --no-gemm-glu) are recorded as they were given, so an A/B's two
    result files say which arm each is; parsed again, the command gives the same flags."""
    from pagoda.runtime.tools.bench.results import command_line

    parser = build_parser("bench")
    for argv, present, absent in (
        (["bench", "throughput", "--workload", "W4", "--gemm-glu", "--no-enable-prefix-caching"],
         ["--gemm-glu", "--no-enable-prefix-caching"], ["--no-gemm-glu", "--enable-prefix-caching"]),
        (["bench", "throughput", "--workload", "W4", "--no-gemm-glu"], ["--no-gemm-glu"], ["--gemm-glu"]),
    ):
        args = parser.parse_args(argv)
        words = shlex.split(command_line(args))
        assert all(w in words for w in present) and not any(w in words for w in absent), words
        again = vars(parser.parse_args(words[1:]))
        assert {k: v for k, v in again.items() if k != "_parser"} == {k: v for k, v in vars(args).items()
                                                                      if k != "_parser"}
