"""A tiny random Llama for structured outputs: unconstrained, it writes garbage, so every valid
output below is the grammar's doing."""

from __future__ import annotations

import pytest

from pagoda.runtime.tools.tiny_models import build_tiny_model

# Bounded on every axis (a pattern, not maxLength: xgrammar 0.2.8's maxLength strings admit raw
# control characters, which JSON forbids), so a random model always reaches the end.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "admin": {"type": "boolean"},
        "role": {"enum": ["dev", "ops", "qa"]},
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3},
    },
    "required": ["name", "age", "admin", "role", "tags"],
    "additionalProperties": False,
}
REGEX = r"[a-c]{2,5}-\d{3}"
CHOICES = ["yes", "no", "maybe so", 'say "hi"']


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("structured") / "llama", "llama"))
