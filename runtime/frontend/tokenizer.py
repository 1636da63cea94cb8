"""Tokenizer loading and chat templates, through transformers' fast tokenizers."""

from __future__ import annotations

import json
from pathlib import Path


def load_tokenizer(path: str | Path, chat_template: str | None = None):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), use_fast=True)
    processor_template = Path(path) / "chat_template.json"
    if chat_template is not None:
        tokenizer.chat_template = _read_template(chat_template)
    elif tokenizer.chat_template is None and processor_template.is_file():
        # An image-text checkpoint may keep its template with its processor, where AutoTokenizer does
        # not look; vLLM falls back to the processor's template as well.
        tokenizer.chat_template = json.loads(processor_template.read_text()).get("chat_template")
    return tokenizer


def _read_template(template: str) -> str:
    """A template is given inline or as a path to a file holding it."""
    if "{" not in template and Path(template).is_file():
        return Path(template).read_text()
    return template


def apply_chat_template(
    tokenizer,
    messages: list[dict],
    chat_template: str | None = None,
    add_generation_prompt: bool = True,
    **kwargs,
) -> str:
    if chat_template is None and tokenizer.chat_template is None:
        raise ValueError("this tokenizer has no chat template; pass chat_template=")
    return tokenizer.apply_chat_template(
        messages,
        chat_template=_read_template(chat_template) if chat_template else None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        **kwargs,
    )
