"""--quantization fp8 on the demo model moves its held-out perplexity by less than 2%.

Perplexity comes from the engine's own prompt logprobs (vLLM's prompt_logprobs, what echo +
logprobs serves) over held-out standard-library modules, in fp32 on the CPU, where the FP8
weights (per-channel e4m3 of the trained weights) are dequantized at load.
"""

from __future__ import annotations

import math

from pagoda.runtime.sampling_params import SamplingParams

CHUNK = 256
CHUNKS = 6


def perplexity(engine, engine_runner, chunks: list[list[int]]) -> float:
    outs = engine_runner(engine, chunks, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))
    total, count = 0.0, 0
    for chunk, out in zip(chunks, outs):
        for pos in range(1, len(chunk)):
            total += out.prompt_logprobs[pos][chunk[pos]].logprob
            count += 1
    return math.exp(-total / count)


def test_fp8_weights_move_perplexity_less_than_two_percent(make_engine, engine_runner, tokenizer, heldout):
    ids = [t for source in heldout.values() for t in tokenizer(source)["input_ids"]]
    chunks = [ids[i * CHUNK:(i + 1) * CHUNK] for i in range(CHUNKS)]
    assert all(len(c) == CHUNK for c in chunks)
    full = perplexity(make_engine(), engine_runner, chunks)
    fp8 = perplexity(make_engine(quantization="fp8"), engine_runner, chunks)
    assert fp8 != full  # the weights did change
    assert abs(fp8 / full - 1) < 0.02, f"perplexity {full:.3f} -> {fp8:.3f} with FP8 weights"
    print(f"held-out perplexity {full:.3f} -> {fp8:.3f} with FP8 weights ({fp8 / full - 1:+.2%})")
