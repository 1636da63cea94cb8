"""The part of a request that PrefixHash hashes: the first N characters of its prompt.

Chat requests hash their messages in order (role and text), so conversations that share a system
prompt share a key; a prompt of token ids hashes its first N ids. Requests with nothing to hash
(embeddings of numbers, say) get the empty key and still land somewhere consistent.
"""

from __future__ import annotations

from typing import Any


def _text(content: Any) -> str:
    """A message's content: a string, or OpenAI's list of parts (only the text parts count)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def prefix_key(body: dict[str, Any], n: int) -> str:
    messages = body.get("messages")
    if isinstance(messages, list):
        text = "".join(
            f"{m.get('role', '')}:{_text(m.get('content'))}\n" for m in messages if isinstance(m, dict)
        )
        return text[:n]
    prompt = body.get("prompt", body.get("input"))
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, int):  # one prompt of token ids
            return ",".join(map(str, prompt[:n]))
        prompt = first  # a batch: its first prompt decides
        if isinstance(prompt, list):
            return ",".join(map(str, prompt[:n]))
    return prompt[:n] if isinstance(prompt, str) else ""
