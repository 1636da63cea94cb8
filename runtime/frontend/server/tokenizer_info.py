"""GET /tokenizer_info, as vLLM serves it (behind --enable-tokenizer-info-endpoint, as vLLM has it):
the tokenizer's tokenizer_config.json as loaded (its init kwargs, without file paths), its class
name, and the chat template the server uses. Special tokens come as their text."""

from __future__ import annotations

from typing import Any


def tokenizer_info(tokenizer, chat_template: str | None) -> dict[str, Any]:
    config = dict(getattr(tokenizer, "init_kwargs", None) or {})
    for path in ("vocab_file", "merges_file", "tokenizer_file", "name_or_path"):
        config.pop(path, None)
    config = _json_safe(config)
    config.setdefault("model_max_length", getattr(tokenizer, "model_max_length", None))
    config["tokenizer_class"] = type(tokenizer).__name__
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if template:
        config["chat_template"] = template
    return config


def _json_safe(obj):
    if hasattr(obj, "content"):  # an AddedToken: its text
        return obj.content
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    if obj is None or isinstance(obj, str | int | float | bool):
        return obj
    return str(obj)
