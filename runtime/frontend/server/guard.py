"""The HTTP guard, in front of every route: the body-size limit and the API key.

Pure ASGI, because it must not buffer SSE. The body limit holds for every body, whatever its framing:
a Content-Length over the limit is refused before a byte is read, and starlette's
RequestBodyLimitMiddleware counts the bytes of a chunked or streamed body as they arrive and stops
reading at the limit (raising a 413 HTTPException inside the route, which errors.py turns into
OpenAI's shape), so the server never holds more than the limit and one chunk of any body.
"""

from __future__ import annotations

import json

from starlette.middleware.body_limit import RequestBodyLimitMiddleware

from pagoda.runtime.frontend.server.api_keys import bearer_token, key_matches
from pagoda.runtime.frontend.server.errors import APIError, error_body

# /health, /metrics and /version stay open for probes and scrapers.
PROTECTED_EXACT = ("/tokenize", "/detokenize", "/tokenizer_info")


def is_protected(path: str) -> bool:
    return path.startswith("/v1/") or path == "/v1" or path in PROTECTED_EXACT


class GuardMiddleware:
    def __init__(self, app, api_keys: list[bytes] | None, max_body_bytes: int):
        self.app = RequestBodyLimitMiddleware(app, max_body_size=max_body_bytes)
        self.api_keys = api_keys
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])  # raw bytes: see api_keys.py for why not decoded text
            length = headers.get(b"content-length", b"")
            if length.isdigit() and int(length) > self.max_body_bytes:
                return await send_error(send, APIError(
                    413, f"The request body is {int(length)} bytes; the limit is {self.max_body_bytes}.",
                    code="request_too_large"))
            if self.api_keys is not None and scope["method"] != "OPTIONS" and is_protected(scope["path"]):
                if not key_matches(bearer_token(headers.get(b"authorization", b"")), self.api_keys):
                    return await send_error(send, APIError(
                        401, "Incorrect or missing API key. Pass it as 'Authorization: Bearer <key>'.",
                        code="invalid_api_key"))
        await self.app(scope, receive, send)


async def send_error(send, err: APIError) -> None:
    body = json.dumps(error_body(err.status, err.message, type=err.type, code=err.code)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if err.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
