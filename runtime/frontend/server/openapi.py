"""The OpenAPI document as the server really answers.

FastAPI documents a 422 with its own validation-error schema on every route that takes a body or
parameters, but errors.py answers every validation error with a 400 in OpenAI's error shape. Clients
and fuzzers read the document, so the 422 goes, and so do the schemas only it used.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

_FASTAPI_VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")


def document_errors_as_served(app: FastAPI) -> None:
    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            schemas = schema.get("components", {}).get("schemas", {})
            for name in _FASTAPI_VALIDATION_SCHEMAS:
                schemas.pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
