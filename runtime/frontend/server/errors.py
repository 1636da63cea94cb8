"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

The OpenAI client maps the status to its exception class (400 BadRequestError, 401
AuthenticationError, 404 NotFoundError, 429 RateLimitError, 5xx InternalServerError), so the status
is what matters most; `type` and `code` follow OpenAI's own values where it has them.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY

from pagoda.runtime.frontend.server.unicode import INVALID_UNICODE

logger = logging.getLogger("pagoda.server")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    """An error that becomes an HTTP response in OpenAI's shape."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def error_body(status: int, message: str, *, type: str | None = None, param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type or _TYPES.get(status, "server_error"),
                      "param": param, "code": code}}


def error_response(err: APIError) -> JSONResponse:
    body = error_body(err.status, err.message, type=err.type, param=err.param, code=err.code)
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse(body, status_code=err.status, headers=headers)


def _field_path(loc) -> list[str]:
    """The JSON path of an error: without FastAPI's leading "body", and without the names pydantic
    gives the members of a union (`str`, `list[int]`, `function-after[...]`)."""
    # A dict key may itself be the invalid text: escape it, or the error message could not be encoded.
    return [str(x).encode("utf-8", "backslashreplace").decode() for x in loc
            if x != "body" and (isinstance(x, int) or not _is_union_tag(str(x)))]


def _is_union_tag(part: str) -> bool:
    return "[" in part or part in ("str", "int", "float", "bool", "list", "dict", "none")


def _describe_validation(exc: RequestValidationError) -> tuple[str, str | None, str]:
    """A one-line message, the offending field, and the error's code."""
    errors = list(exc.errors())
    # A union reports each member's error; the invalid-Unicode one is the one that says what is wrong.
    specific = [e for e in errors if e.get("type") == INVALID_UNICODE]
    errors = specific or errors
    parts, param, code = [], None, INVALID_UNICODE if specific else "invalid_value"
    for e in errors[:5]:
        if e.get("type") == "json_invalid":
            code = "invalid_json"
            parts.append(f"malformed JSON: {e.get('ctx', {}).get('error') or e.get('msg', '')}")
            continue
        path = _field_path(e.get("loc", ()))
        # A model-level check has no location; it names its field in ctx.
        field = path[0] if path else (e.get("ctx") or {}).get("param")
        param = param or field
        where = ".".join(path) or field or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid value')}")
    return "; ".join(dict.fromkeys(parts)) or "invalid request", param, code


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        message, param, code = _describe_validation(exc)
        return error_response(APIError(400, message, param=param, code=code))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 413:  # starlette's body limit, counting a chunked body as it arrived
            limit = request.scope.get(MAX_BODY_SIZE_SCOPE_KEY)
            return error_response(APIError(413, f"The request body is over the limit of {limit} bytes.",
                                           code="request_too_large"))
        return error_response(APIError(exc.status_code, str(exc.detail)))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception):
        logger.exception("unhandled error")
        return error_response(APIError(500, f"internal error: {type(exc).__name__}: {exc}"))
