"""The base of every model in the ModelServer schema (spec.py, status_schema.py).

Python fields are snake_case, the CRD's camelCase (pydantic aliases); unknown fields are errors, so
a typo in a spec is rejected with its name rather than ignored.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
