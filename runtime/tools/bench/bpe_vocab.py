"""A byte-level BPE tokenizer of any vocabulary size, made up rather than trained.

W1 runs random weights on a word-level tokenizer ("t123" per id), which no grammar can spell: a
JSON schema needs tokens such as `{"`, `name` and `": `. This one has the 256 byte tokens of GPT-2's
alphabet, then merges of existing tokens drawn from a seeded generator until the vocabulary is
full, with the real checkpoint's special tokens at their ids. Every id decodes (so random weights
never break detokenization), and grammars see a vocabulary shaped like a real one: mostly short
pieces, some long ones, all of ASCII well covered.
"""

from __future__ import annotations

import random

# Printable pieces a real vocabulary is made of, so merges look like text, code and JSON.
SEED_PIECES = ['{"', '":', '": ', '", "', '"}', ', ', '},', '{', '}', '[', ']', 'true', 'false', 'null',
               ' the', 'ing', 'tion', 'name', 'id', 'value', 'type', 'score', 'tags', '00', '\n', '  ']


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: which printable character stands for each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def build_bpe_tokenizer(vocab_size: int, special: dict[int, str], seed: int = 0):
    """A tokenizers.Tokenizer: byte-level BPE with `vocab_size` ids, `special` at their ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = bytes_to_unicode()
    rng = random.Random(seed)
    num_regular = vocab_size - len(special)
    vocab: dict[str, int] = {}
    free_ids = iter(i for i in range(vocab_size) if i not in special)

    def add(token: str) -> None:
        vocab[token] = next(free_ids)

    for b in range(256):
        add(alphabet[b])
    tokens = list(vocab)
    merges: list[tuple[str, str]] = []

    def encode_piece(piece: str) -> str:
        return "".join(alphabet[b] for b in piece.encode())

    # Seed pieces first (each built left to right from existing tokens), then random merges.
    for piece in SEED_PIECES:
        chars = encode_piece(piece)
        left = chars[0]
        for ch in chars[1:]:
            merged = left + ch
            if merged not in vocab and len(vocab) < num_regular:
                merges.append((left, ch))
                add(merged)
                tokens.append(merged)
            left = merged
    printable = [alphabet[b] for b in range(32, 127)]
    while len(vocab) < num_regular:
        # Short left parts and printable right parts mostly, as frequency-ordered merges are.
        left = tokens[min(int(rng.expovariate(1 / 2000)), len(tokens) - 1)] if rng.random() < 0.7 else \
            rng.choice(printable)
        right = rng.choice(printable) if rng.random() < 0.8 else tokens[rng.randrange(len(tokens))]
        merged = left + right
        if merged in vocab or len(merged) > 12:
            continue
        merges.append((left, right))
        add(merged)
        tokens.append(merged)
    full_vocab = dict(vocab)
    for i, t in special.items():
        full_vocab[t] = i
    tok = Tokenizer(models.BPE(vocab=full_vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for _, t in sorted(special.items())])
    return tok
