"""A final-only text decoded whole (IncrementalDetokenizer(whole=True)) against the stream that
decodes it token by token: the same text, byte for byte, over the tokens that make streams hard
(multi-byte characters split across tokens, bytes that never form a character, special and added
tokens with skip_special_tokens on and off, ids past the tokenizer's vocabulary, prompts that end
inside a character), on a byte-level BPE tokenizer; and where the whole decode is not exact (a
decoder that is not byte-level), it is not used."""

from __future__ import annotations

import random

import pytest
from tokenizers import AddedToken
from transformers import PreTrainedTokenizerFast

from pagoda.runtime.frontend.detokenizer import IncrementalDetokenizer, decodes_whole
from pagoda.runtime.sampling_params import SamplingParams
from pagoda.runtime.tools.bench.bpe_vocab import build_bpe_tokenizer
from pagoda.runtime.tools.bench.workloads import build_synthetic_tokenizer

VOCAB = 2000
SPECIAL = {0: "<|endoftext|>", 1: "<|im_start|>", 2: "<|im_end|>"}
TEXTS = ["héllo wörld 日本語 — ok", "emoji 🎉🚀 and ünïcödé", "tabs\tand\nnewlines  ", "¿qué? «ça» 中文", "a"]


@pytest.fixture(scope="module")
def tok():
    backend = build_bpe_tokenizer(VOCAB, SPECIAL)
    backend.add_tokens([AddedToken("<tool>", special=False), AddedToken("→é", special=False)])
    t = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>", clean_up_tokenization_spaces=False)
    assert decodes_whole(t)
    return t


def _sequences(tok, rng: random.Random, n: int) -> list[list[int]]:
    """Token lists: encoded text, random byte-level ids (which split and break characters), special and
    added tokens, ids past the vocabulary (a model's padded rows), and mixtures of them."""
    vocab = len(tok)
    out = []
    for i in range(n):
        parts = []
        for _ in range(rng.randrange(1, 6)):
            kind = rng.randrange(5)
            if kind == 0:
                parts += tok.encode(rng.choice(TEXTS), add_special_tokens=False)
            elif kind == 1:
                parts += [rng.randrange(3, 259) for _ in range(rng.randrange(1, 8))]  # single bytes
            elif kind == 2:
                parts += [rng.randrange(vocab) for _ in range(rng.randrange(1, 8))]
            elif kind == 3:
                parts += [rng.choice([0, 1, 2, vocab - 1, vocab - 2])]  # special / added
            else:
                parts += [rng.randrange(vocab, vocab + 40)]  # padded vocabulary rows
        if i % 7 == 0:
            parts = parts[: rng.randrange(1, len(parts) + 1)]
        out.append(parts)
    return out


def _final_text(tok, prompt, output, params, whole, stop_terminated):
    ids: list[int] = []
    d = IncrementalDetokenizer(tok, prompt, params, ids, whole=whole)
    for k in range(0, len(output), 3):  # a few tokens per step, as the output processor hands them
        new = output[k : k + 3]
        ids += new
        d.update(new, stop_terminated and k + 3 >= len(output))
    d.flush()
    return d, d.get_text(True)


@pytest.mark.parametrize("skip", [True, False])
def test_the_whole_decode_gives_the_streams_text(tok, skip):
    rng = random.Random(7 if skip else 8)
    prompts = _sequences(tok, rng, 60) + [tok.encode("say:", add_special_tokens=False), [0], [300, 301]]
    outputs = _sequences(tok, rng, 60)
    used = 0
    for i, prompt in enumerate(prompts):
        for j in (i, i + 1, i + 7):
            output = outputs[j % len(outputs)]
            params = SamplingParams(skip_special_tokens=skip, include_stop_str_in_output=bool(j % 2))
            for stop_terminated in (False, True):
                d, want = _final_text(tok, prompt, output, params, False, stop_terminated)
                fast, got = _final_text(tok, prompt, output, params, True, stop_terminated)
                assert got == want, (prompt, output, skip, stop_terminated)
                used += fast.whole
    assert used > len(prompts)  # most prompts end on a whole character: the whole decode ran


def test_a_prompt_ending_inside_a_character_keeps_the_stream(tok):
    """The last prompt tokens hold the first bytes of a character the output completes: the stream
    emits that character, a decode of the output alone would not, so the stream is kept."""
    e_acute = "é".encode()
    byte_ids = {b: tok.convert_tokens_to_ids(c) for b, c in _byte_tokens().items()}
    prompt = [byte_ids[b] for b in b"so"] * 12 + [byte_ids[e_acute[0]]]
    output = [byte_ids[e_acute[1]], byte_ids[ord("!")]]
    params = SamplingParams()
    slow, want = _final_text(tok, prompt, output, params, False, False)
    fast, got = _final_text(tok, prompt, output, params, True, False)
    assert not fast.whole and got == want
    assert tok.backend_tokenizer.decode(output) != want  # what the whole decode would have given


def test_a_text_read_while_running_keeps_the_stream(tok):
    ids: list[int] = []
    d = IncrementalDetokenizer(tok, [300], SamplingParams(), ids, whole=True)
    out = tok.encode(TEXTS[0], add_special_tokens=False)
    ids += out[:3]
    d.update(out[:3], False)
    d.get_text(False)  # streamed or cumulative: part of it went through the stream already
    ids += out[3:]
    d.update(out[3:], False)
    d.flush()
    assert d.get_text(True) == TEXTS[0]


def test_decoders_that_are_not_byte_level_do_not_decode_whole():
    word_level = build_synthetic_tokenizer("tiny")  # no decoder: tokens are joined with spaces
    assert not decodes_whole(word_level)
    bpe = PreTrainedTokenizerFast(tokenizer_object=build_bpe_tokenizer(VOCAB, SPECIAL), clean_up_tokenization_spaces=True)
    assert not decodes_whole(bpe)  # transformers' clean-up would apply to the held-back tail


def _byte_tokens() -> dict[int, str]:
    from pagoda.runtime.tools.bench.bpe_vocab import bytes_to_unicode

    return bytes_to_unicode()


def test_decoding_the_completions_that_end_together_gives_each_ones_text(tok):
    """flush_together (the requests that end in one step, decoded in one decode_batch per
    skip_special_tokens setting) against flush() one by one: the same texts, including for
    detokenizers that cannot decode whole (read before, or a prompt ending inside a character)."""
    from pagoda.runtime.frontend.detokenizer import flush_together

    rng = random.Random(3)
    prompts, outputs = _sequences(tok, rng, 40), _sequences(tok, rng, 40)

    def build(i):
        ids: list[int] = []
        params = SamplingParams(skip_special_tokens=bool(i % 3), include_stop_str_in_output=bool(i % 5 == 0))
        d = IncrementalDetokenizer(tok, prompts[i], params, ids, whole=True)
        for k in range(0, len(outputs[i]), 2):
            ids += outputs[i][k : k + 2]
            d.update(outputs[i][k : k + 2], i % 4 == 0 and k + 2 >= len(outputs[i]))
            if i % 7 == 0:
                d.get_text(False)  # streamed
        return d

    alone = [build(i) for i in range(40)]
    for d in alone:
        d.flush()
    together = [build(i) for i in range(40)]
    assert sum(d.decodes_whole_now() for d in together) > 20
    flush_together(together)
    for d in together:
        d.flush()  # what _make_output does next: a no-op for those decoded together
    assert [d.get_text(True) for d in together] == [d.get_text(True) for d in alone]
