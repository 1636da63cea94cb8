"""On the trained demo model, the engine's greedy tokens equal transformers', in fp32.

A trained model is the case a random tiny model cannot cover: confident, structured logits over
real code prompts, a real 8k-token BPE, and prompts of very different lengths in one batch.
"""

from __future__ import annotations

MAX_TOKENS = 32
LONG_PROMPT_TOKENS = 300

PROMPTS = [
    "def fibonacci(n):",
    "class Stack:",
    "import os\n\ndef ",
    "for i in range(10):\n    ",
    'if __name__ == "__main__":\n',
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n",
    'def read_lines(path):\n    """Return the lines of the file at *path*, without newlines."""\n',
    "import re\n\n_WORD = re.compile(r'\\w+')\n\n\ndef count_words(text):\n",
]


def test_greedy_matches_transformers(
    make_engine, engine_runner, tokenizer, hf_greedy, heldout, max_model_len
):
    from pagoda.runtime.sampling_params import SamplingParams

    prompts = [tokenizer(text, add_special_tokens=False).input_ids for text in PROMPTS]
    # Plus the openings of two held-out modules: long prompts the model has never seen.
    long_len = min(LONG_PROMPT_TOKENS, max_model_len - MAX_TOKENS)
    prompts += [
        tokenizer(src, add_special_tokens=False).input_ids[:long_len] for src in list(heldout.values())[:2]
    ]
    texts = [tokenizer.decode(prompt) for prompt in prompts]
    assert max(map(len, prompts)) == long_len > 10 * min(map(len, prompts))

    engine = make_engine()
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = engine_runner(engine, prompts, params)

    for text, prompt, output in zip(texts, prompts, outputs):
        expected, margins = hf_greedy(prompt, MAX_TOKENS)
        got = output.outputs[0].token_ids
        if got != expected:
            i = next(
                (k for k, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected))
            )
            margin = margins[i] if i < len(margins) else float("nan")
            raise AssertionError(
                f"prompt {text[:40]!r}: first difference at generated token {i} "
                f"(engine {got[i : i + 4]}, transformers {expected[i : i + 4]}); transformers' top-2 logit gap "
                f"there is {margin:.2e}"
            )
        assert output.outputs[0].finish_reason == "length"
        assert output.outputs[0].text == tokenizer.decode(expected, skip_special_tokens=True)
