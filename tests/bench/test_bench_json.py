"""Smoke run of W1-json (`pagoda bench throughput --json-schema`) on the tiny dummy model with its
BPE tokenizer (CPU): every output is still output-len tokens long (the schema forces more),
and the record carries the ratio to the plain run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# pyproject's runtime extra installs xgrammar (CI has it); a venv built before it was added may not.
pytest.importorskip("xgrammar")

from pagoda.runtime.cli import main
from pagoda.runtime.tools.bench.workloads import build_synthetic_tokenizer

SCHEMA = Path(__file__).resolve().parents[2] / "e2e" / "w1_json_schema.json"


@pytest.fixture(autouse=True)
def bench_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGODA_BENCH_CACHE", str(tmp_path / "models"))


def test_bpe_tokenizer_spells_json_and_decodes_every_id():
    tok = build_synthetic_tokenizer("tiny-bpe")
    text = '{"records": [{"id": 7, "name": "x"}]}'
    assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text
    assert len(tok) == 30016
    assert all(isinstance(tok.decode([i]), str) for i in range(0, 30016, 97))


def test_w1_json_smoke(tmp_path):
    out = tmp_path / "results"
    common = ["bench", "throughput", "--model", "tiny-bpe", "--num-prompts", "2", "--output-len", "12",
              "--warmup-prompts", "1", "--warmup-tokens", "2", "--max-model-len", "1100", "--out", str(out)]
    assert main(common + ["--label", "W1-bpe"]) == 0
    (plain,) = out.glob("W1-bpe-pagoda-*.json")
    assert main(common + ["--json-schema", str(SCHEMA), "--plain-result", str(plain)]) == 0
    (path,) = out.glob("W1-json-pagoda-*.json")
    record = json.loads(path.read_text())
    assert record["workload"] == "W1-json" and record["json_schema"] == SCHEMA.name
    assert record["all_full_length"] is True and record["output_tokens"] == 2 * 12
    plain_tps = json.loads(plain.read_text())["output_tokens_per_s"]
    assert record["ratio_to_plain"] == pytest.approx(record["output_tokens_per_s"] / plain_tps)
