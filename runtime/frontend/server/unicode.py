"""Invalid Unicode in a request body becomes a 400 that names the field, never a 500.

Two ways in: JSON may escape a lone surrogate ("\\ud800"), which json.loads turns into a Python str
the tokenizers cannot encode; and the raw body may hold bytes that are not UTF-8 at all. The body is
decoded with errors="surrogateescape" (body.py), so every invalid byte becomes a lone surrogate too
(U+DC80..U+DCFF), and one field type, `Text`, refuses lone surrogates wherever a string reaches the
model. Pydantic then reports the field, as it does for any other bad value.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

INVALID_UNICODE = "invalid_unicode"
_SURROGATE = re.compile("[\ud800-\udfff]")


def _valid_unicode(value: str) -> str:
    if not value.isascii() and (m := _SURROGATE.search(value)):
        raise PydanticCustomError(
            INVALID_UNICODE,
            "holds invalid Unicode at character {position}: a lone surrogate, or bytes that are not UTF-8",
            {"position": m.start()})
    return value


def check_unicode(value: Any) -> Any:
    """Every string inside free-form JSON (a tool's schema, say)."""
    if isinstance(value, str):
        _valid_unicode(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            check_unicode(k)
            check_unicode(v)
    elif isinstance(value, list):
        for v in value:
            check_unicode(v)
    return value


Text = Annotated[str, AfterValidator(_valid_unicode)]
