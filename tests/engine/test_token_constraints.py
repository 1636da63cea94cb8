"""logit_bias, allowed_token_ids and bad_words through LLM.generate, against transformers' own
logits processors (sequence_bias, prefix_allowed_tokens_fn, bad_words_ids) on the same weights,
and over many seeds of random sampling; with n > 1, preemption and a grammar in the same batch."""

from __future__ import annotations

from collections import Counter

import pytest

from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.frontend.processor import bad_words_token_ids

from .conftest import make_prompts

SEEDS = range(16)


@pytest.fixture(scope="module")
def llama(tiny_models):
    return tiny_models["llama"]


@pytest.fixture(scope="module")
def llm(llama):
    return LLM(llama, block_size=8, max_model_len=256, device="cpu")


def gen(llm, prompts, params):
    return llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)


def tokens(outs) -> list[list[int]]:
    return [list(c.token_ids) for o in outs for c in o.outputs]


def test_logit_bias_matches_transformers_sequence_bias(llama, llm, hf):
    prompts = make_prompts(seed=11)[6:10]
    plain = tokens(gen(llm, prompts, SamplingParams(temperature=0, max_tokens=10)))
    # Push down each prompt's favourite and lift two others: the greedy path must change.
    favourite = Counter(t for seq in plain for t in seq).most_common(1)[0][0]
    bias = {favourite: -8.0, 300: 4.0, 301: 2.5}
    got = tokens(gen(llm, prompts, SamplingParams(temperature=0, max_tokens=10, logit_bias=bias)))
    want = [hf.greedy(llama, p, sequence_bias={(t,): b for t, b in bias.items()}) for p in prompts]
    assert got == want
    assert got != plain


def test_logit_bias_of_100_forces_the_token_and_offline_values_are_clamped(llm):
    prompts = make_prompts(seed=12)[4:8]
    for temperature in (0.0, 1.0):
        params = [SamplingParams(temperature=temperature, seed=s, max_tokens=8, logit_bias={"77": 100})
                  for s in range(len(prompts))]
        assert all(seq == [77] * 8 for seq in tokens(gen(llm, prompts, params)))
    assert SamplingParams(logit_bias={5: 250.0, 6: -1e9}).logit_bias == {5: 100.0, 6: -100.0}


def test_allowed_token_ids_match_transformers_and_bound_every_draw(llama, llm, hf):
    prompts = make_prompts(seed=13)[5:9]
    allowed = [40, 41, 42, 200, 201, 450]
    got = tokens(gen(llm, prompts, SamplingParams(temperature=0, max_tokens=10, allowed_token_ids=allowed)))
    want = [hf.greedy(llama, p, prefix_allowed_tokens_fn=lambda _b, _ids: allowed) for p in prompts]
    assert got == want
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=12, allowed_token_ids=allowed) for s in SEEDS]
    drawn = tokens(gen(llm, [prompts[0]] * len(SEEDS), params))
    assert {t for seq in drawn for t in seq} <= set(allowed)
    assert len({t for seq in drawn for t in seq}) > 2  # a draw among the allowed, not one forced token


def _greedy_opening_word(llm) -> tuple[list[int], list[int], str]:
    """(prompt, its first two greedy tokens, them as a word that tokenizes back to them)."""
    tok = llm.get_tokenizer()
    prompts = make_prompts(seed=14)
    for prompt, seq in zip(prompts, tokens(gen(llm, prompts, SamplingParams(temperature=0, max_tokens=2)))):
        word = tok.decode(seq)
        if word.strip() and "\ufffd" not in word and bad_words_token_ids(tok, [word])[0] == seq:
            return prompt, seq, word
    pytest.fail("no greedy opening spells a word")


def _contains(seq: list[int], word: list[int]) -> bool:
    return any(seq[i:i + len(word)] == word for i in range(len(seq) - len(word) + 1))


def test_bad_words_never_appear_and_match_transformers(llama, llm, hf):
    prompt, pair, word = _greedy_opening_word(llm)
    tok = llm.get_tokenizer()
    banned = bad_words_token_ids(tok, [word])
    # Near-greedy draws (the random model's logits are flat): unconstrained, several write the word.
    free = tokens(gen(llm, [prompt] * len(SEEDS), [SamplingParams(temperature=0.1, seed=s, max_tokens=24)
                                                    for s in SEEDS]))
    assert sum(_contains(seq, pair) for seq in free) >= 3
    params = [SamplingParams(temperature=0.1, seed=s, max_tokens=24, bad_words=[word]) for s in SEEDS]
    drawn = tokens(gen(llm, [prompt] * len(SEEDS), params))
    assert not any(_contains(seq, b) for seq in drawn for b in banned)
    assert any(pair[0] in seq for seq in drawn)  # only the word is banned, not its first token
    # Greedy, against transformers' NoBadWordsLogitsProcessor (the prompt does not end in a prefix).
    prompts = make_prompts(seed=15)[8:11]
    plain = tokens(gen(llm, prompts, SamplingParams(temperature=0, max_tokens=10)))
    favourite = next(w for t, _ in Counter(t for seq in plain for t in seq).most_common()
                     if (w := tok.decode([t])).strip() and [t] in bad_words_token_ids(tok, [w]))
    words = [favourite, word]
    ids = bad_words_token_ids(tok, words)
    assert all(p[-1] != w[0] for p in prompts for w in ids if len(w) > 1)
    got = tokens(gen(llm, prompts, SamplingParams(temperature=0, max_tokens=10, bad_words=words)))
    assert got == [hf.greedy(llama, p, bad_words_ids=ids) for p in prompts]
    assert got != plain


def test_constraints_hold_with_n_preemption_and_grammar(llama):
    """n > 1 children share the constraints; a pool too small for the batch preempts and recomputes
    them; a grammar in the same batch composes with the bias (the bias picks the choice)."""
    pytest.importorskip("xgrammar")
    from pagoda.runtime import StructuredOutputsParams

    tight = LLM(llama, block_size=8, max_model_len=128, device="cpu", num_kv_blocks=24)
    tok = tight.get_tokenizer()
    allowed = [40, 41, 42, 200, 201, 450]
    prompts = make_prompts(seed=16)[9:14]
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=30, allowed_token_ids=allowed)
    outs = gen(tight, prompts, params)
    assert tight.llm_engine.scheduler.num_preemptions > 0
    assert all(set(seq) <= set(allowed) and len(seq) == 30 for seq in tokens(outs))
    beta = tok.encode("beta", add_special_tokens=False)[0]
    so = StructuredOutputsParams(choice=["alpha", "beta"])
    chosen = tight.generate(["pick:"] * 8, [SamplingParams(temperature=1.0, seed=s, max_tokens=8,
                                                           structured_outputs=so, logit_bias={beta: 100.0})
                                            for s in range(8)], use_tqdm=False)
    assert [o.outputs[0].text for o in chosen] == ["beta"] * 8
