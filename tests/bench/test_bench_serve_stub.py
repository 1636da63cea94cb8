"""`pagoda bench serve` end to end against a stub OpenAI-compatible SSE server over real HTTP: the
payloads it sends, the warm-up, the sweep, the record and plot it writes, error counting and the
text-prompt fallback.

Nothing here reads the wall clock: on a loaded machine any latency bound flakes. The timing
arithmetic and the Poisson schedule are checked exactly, in virtual time, in
test_bench_load_virtual.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict

from pagoda.runtime.cli import main
from pagoda.runtime.tools.bench.serve_client import arrival_offsets

FIRST_DELAY = 0.010  # small: the stub only has to stream, nothing times it
INTERVAL = 0.005


class CompletionBody(BaseModel):
    """What the generator must send: forced lengths (vLLM's extensions) and streaming with usage."""

    model_config = ConfigDict(extra="forbid")
    model: str
    prompt: list[int] | str
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    temperature: float = 1.0
    stream: bool = False
    stream_options: dict | None = None


def make_stub(accept_token_ids: bool = True, fail_every: int = 0):
    app = FastAPI()
    state = {"in_flight": 0, "max_in_flight": 0, "bodies": [], "count": 0}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "stub-model", "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionBody):
        if isinstance(body.prompt, list) and not accept_token_ids:
            return JSONResponse({"error": {"message": "prompt must be a string", "type": "invalid_request_error"}},
                                status_code=400)
        if not body.stream:  # the generator's probe for token-id prompts
            return {"choices": [{"index": 0, "text": " t1", "finish_reason": "length"}]}
        state["count"] += 1
        if fail_every and state["count"] % fail_every == 0:
            return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500)
        state["bodies"].append(body)
        prompt_tokens = len(body.prompt) if isinstance(body.prompt, list) else len(body.prompt.split())

        async def events():
            state["in_flight"] += 1
            state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
            try:
                await asyncio.sleep(FIRST_DELAY)
                for i in range(body.max_tokens):
                    if i:
                        await asyncio.sleep(INTERVAL)
                    chunk = {"object": "text_completion", "choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]}
                    yield f"data: {json.dumps(chunk)}\n\n"
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": body.max_tokens,
                         "total_tokens": prompt_tokens + body.max_tokens}
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                state["in_flight"] -= 1

        return StreamingResponse(events(), media_type="text/event-stream")

    return app, state


def _bench(base_url: str, out, *extra: str, warmup: int = 0) -> tuple[int, dict]:
    rc = main(["bench", "serve", "--base-url", base_url, "--num-prompts", "6", "--input-len", "8:16",
               "--output-len", "5:9", "--warmup-prompts", str(warmup), "--no-progress", "--out", str(out), *extra])
    (path,) = out.glob("W3-*.json")
    return rc, json.loads(path.read_text())


def test_sweep_record_matches_the_stub(serve_app, tmp_path):
    app, state = make_stub()
    with serve_app(app) as url:
        rc, record = _bench(url, tmp_path, "--request-rate", "inf", "--offline-tokens-per-s", "1000", warmup=3)
    assert rc == 0
    # The warm-up went first (16 tokens each) and stays out of the figures.
    warmup_bodies, state["bodies"] = state["bodies"][:3], state["bodies"][3:]
    assert [b.max_tokens for b in warmup_bodies] == [16, 16, 16] and len(state["bodies"]) == 6
    assert record["workload"] == "W3" and record["prompt_format"] == "ids" and record["model"] == "stub-model"
    (rate,) = record["rates"]
    assert rate["request_rate"] == "inf" and rate["completed"] == 6 and rate["failed"] == 0
    assert rate["output_len_mismatches"] == 0 and rate["usage_reported"]
    assert rate["ttft_ms_p50"] <= rate["ttft_ms_p90"] <= rate["ttft_ms_p99"]
    # Every request got exactly its drawn length, forced by min_tokens + ignore_eos.
    for body in state["bodies"]:
        assert body.ignore_eos and body.min_tokens == body.max_tokens and 5 <= body.max_tokens <= 9
        assert isinstance(body.prompt, list) and 8 <= len(body.prompt) <= 16
        assert body.stream_options == {"include_usage": True}
    assert rate["output_tokens"] == sum(b.max_tokens for b in state["bodies"])
    assert rate["prompt_tokens"] == sum(len(b.prompt) for b in state["bodies"])
    assert rate["output_tokens_per_s"] == pytest.approx(rate["output_tokens"] / rate["duration_s"])
    assert record["served_to_offline_ratio"] == pytest.approx(rate["output_tokens_per_s"] / 1000)
    png = tmp_path / record["plot"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for key in ("gpu", "commit", "torch", "triton", "command", "backend"):
        assert key in record
    assert record["command"].startswith("pagoda bench serve --base-url")
    assert "--input-len 8:16 --output-len 5:9" in record["command"]


def test_rate_sweep_and_concurrency_cap(serve_app, tmp_path):
    app, state = make_stub()
    with serve_app(app) as url:
        rc, record = _bench(url, tmp_path, "--request-rate", "20", "inf", "--max-concurrency", "2", "--seed", "3")
    assert rc == 0
    assert [r["request_rate"] for r in record["rates"]] == [20.0, "inf"]
    assert all(r["completed"] == 6 and r["failed"] == 0 for r in record["rates"])
    assert record["max_concurrency"] == 2
    assert state["max_in_flight"] <= 2  # a bound the semaphore guarantees, whatever the timing


def test_arrival_offsets_are_poisson():
    offsets = arrival_offsets(20000, 8.0, seed=0)
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert offsets[0] == 0.0 and all(g >= 0 for g in gaps)
    assert sum(gaps) / len(gaps) == pytest.approx(1 / 8.0, rel=0.03)
    assert arrival_offsets(20000, 8.0, seed=0) == offsets  # reproducible
    assert arrival_offsets(5, float("inf"), seed=0) == [0.0] * 5


def test_errors_are_counted_and_text_fallback(serve_app, tmp_path, monkeypatch):
    monkeypatch.setenv("PAGODA_BENCH_CACHE", str(tmp_path / "models"))
    app, state = make_stub(accept_token_ids=False, fail_every=3)
    with serve_app(app) as url:
        rc, record = _bench(url, tmp_path, "--request-rate", "inf", "--tokenizer", "tiny")
    assert rc == 1  # a failed request makes the command fail
    (rate,) = record["rates"]
    assert record["prompt_format"] == "text"
    assert rate["failed"] == 2 and rate["completed"] == 4
    assert list(rate["errors"].values()) == [2] and "HTTP 500" in next(iter(rate["errors"]))
    assert record["targets"]["no_failures"] is False
    # Text prompts are the drawn ids, detokenized: the synthetic tokenizer spells id n as "tn".
    assert all(isinstance(b.prompt, str) and b.prompt.split()[0].startswith("t") for b in state["bodies"])
