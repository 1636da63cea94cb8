"""The demo model's data: the Python standard library of the interpreter that runs the trainer.

Everything is found at run time (`sysconfig`'s stdlib folder), so the GPU machine needs nothing
carried over. A fixed list of modules, with their tests, is held out for evaluation; the rest is
training text. Docstring-carrying functions are also framed as ChatML turns (the docstring asks,
the code answers), so the chat template produces code rather than noise.
"""

from __future__ import annotations

import ast
import random
import sysconfig
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

# Held out from tokenizer and model training alike, together with their test files. Every name
# exists, with the same layout, in CPython 3.8 through 3.13.
HELDOUT_MODULES = (
    "argparse",
    "configparser",
    "csv",
    "difflib",
    "fractions",
    "heapq",
    "json",
    "shlex",
    "statistics",
    "textwrap",
)

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, PAD]

# ChatML, as in pagoda.runtime.tools.tiny_models (copied: this script must run without pagoda installed).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# pydoc_data/topics.py is 750 kB of prose in one dict literal: it is documentation, not code.
MAX_FILE_BYTES = 512_000

_REQUESTS = (
    "Write a Python function `{name}`. {doc}",
    "Implement `{name}` in Python: {doc}",
    "{doc}\nWrite this in Python as `{name}`.",
    "Write a Python function that does the following. {doc}",
)


@dataclass(slots=True)
class Corpus:
    stdlib: Path
    train: dict[str, str] = field(default_factory=dict)  # relative path -> source text
    heldout: dict[str, str] = field(default_factory=dict)
    skipped: int = 0  # files that are not UTF-8 or too large

    def stats(self) -> dict:
        return {
            "stdlib": str(self.stdlib),
            "train_files": len(self.train),
            "train_bytes": sum(len(t.encode()) for t in self.train.values()),
            "heldout_files": len(self.heldout),
            "heldout_bytes": sum(len(t.encode()) for t in self.heldout.values()),
            "skipped_files": self.skipped,
            "heldout_modules": list(HELDOUT_MODULES),
            "heldout_paths": sorted(self.heldout),
        }


def _is_heldout(parts: tuple[str, ...]) -> bool:
    top = parts[0].removesuffix(".py")
    return top in HELDOUT_MODULES


def _is_heldout_test(parts: tuple[str, ...]) -> bool:
    # test/test_json/..., test/test_csv.py: kept out of training so the held-out code never leaks.
    if len(parts) < 2 or parts[0] != "test":
        return False
    name = parts[1].removesuffix(".py")
    return any(name == f"test_{m}" or name.startswith(f"test_{m}_") for m in HELDOUT_MODULES)


def load_corpus(limit_files: int | None = None) -> Corpus:
    """Read every stdlib `.py` file in sorted order, splitting held-out modules from the rest."""
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    corpus = Corpus(stdlib=stdlib)
    for path in sorted(stdlib.rglob("*.py")):
        parts = path.relative_to(stdlib).parts
        if {"site-packages", "dist-packages", "__pycache__"} & set(parts):
            continue
        if path.stat().st_size > MAX_FILE_BYTES:
            corpus.skipped += 1
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except (UnicodeDecodeError, OSError):
            corpus.skipped += 1  # a few tests hold deliberately mis-encoded files
            continue
        rel = "/".join(parts)
        if _is_heldout(parts):
            corpus.heldout[rel] = text
        elif not _is_heldout_test(parts):
            corpus.train[rel] = text
    if limit_files is not None:  # --tiny: a small, fixed subset of both
        corpus.train = dict(list(corpus.train.items())[:limit_files])
        corpus.heldout = dict(list(corpus.heldout.items())[: max(2, limit_files // 10)])
    if not corpus.train or not corpus.heldout:
        raise SystemExit(f"no stdlib sources found under {stdlib}: is this a full Python install?")
    return corpus


def chat_examples(corpus: Corpus, seed: int) -> list[str]:
    """ChatML conversations from library (non-test) functions that carry a docstring."""
    rng = random.Random(seed)
    examples = []
    for rel, text in corpus.train.items():
        if rel.startswith(("test/", "idlelib/idle_test/", "lib2to3/tests/")):
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        lines = text.splitlines()  # ast.get_source_segment re-splits the file on every call
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc or node.end_lineno - node.lineno > 80:
                continue
            request = doc.split("\n\n")[0].strip()
            code = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno]))
            if not 20 <= len(request) <= 400 or len(code) > 2500:
                continue
            user = rng.choice(_REQUESTS).format(name=node.name, doc=request)
            examples.append(
                f"{IM_START}user\n{user}{IM_END}\n{IM_START}assistant\n```python\n{code}\n```{IM_END}\n"
            )
    return examples


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE over the training text, wrapped as a transformers fast tokenizer."""
    from transformers import PreTrainedTokenizerFast

    from pagoda.runtime.tools.tiny_models import train_byte_level_bpe

    tok = train_byte_level_bpe(texts, vocab_size, SPECIAL_TOKENS)
    # Generation stops at <|im_end|> (the end of a chat turn); generation_config adds
    # <|endoftext|>, the end of a file. No BOS is prepended: prompts start cold, as training
    # windows do.
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=ENDOFTEXT,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[ENDOFTEXT, IM_START],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def encode_stream(tokenizer, docs: list[str], seed: int | None) -> list[int]:
    """Documents (shuffled when a seed is given), each preceded by <|endoftext|>, as one stream."""
    docs = list(docs)
    if seed is not None:
        random.Random(seed).shuffle(docs)
    eot = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    stream: list[int] = []
    # The raw `tokenizers` object encodes batches on all cores; the wrapper would be slower.
    backend = getattr(tokenizer, "backend_tokenizer", None) or tokenizer._tokenizer
    for enc in backend.encode_batch(docs, add_special_tokens=False):
        stream.append(eot)
        stream.extend(enc.ids)
    return stream
