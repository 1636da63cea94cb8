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


def _describe_validation(exc: RequestValidationError) -> tuple[str, str | None, bool]:
    """A one-line message, the offending field, and whether the body was not JSON at all."""
    parts, param, malformed = [], None, False
    for e in exc.errors()[:5]:
        loc = [str(x) for x in e.get("loc", ()) if x != "body"]
        if e.get("type") == "json_invalid":
            malformed = True
            parts.append(f"malformed JSON: {e.get('msg', '')}")
            continue
        where = ".".join(loc) or "body"
        param = param or (loc[0] if loc else None)
        parts.append(f"{where}: {e.get('msg', 'invalid value')}")
    return "; ".join(parts) or "invalid request", param, malformed


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        message, param, malformed = _describe_validation(exc)
        return error_response(APIError(400, message, param=param,
                                       code="invalid_json" if malformed else "invalid_value"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        return error_response(APIError(exc.status_code, str(exc.detail)))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception):
        logger.exception("unhandled error")
        return error_response(APIError(500, f"internal error: {type(exc).__name__}: {exc}"))
