"""JSON request bodies parsed and validated on a worker thread, not on the event loop.

A 10 MB prompt takes tens of milliseconds to decode, parse and validate; on the event loop that
delays every /health probe and every stream by as much, per request. FastAPI does all three on the
loop, so this route does them first, on a thread, and hands FastAPI the validated model: FastAPI
re-checks an instance of the right model in microseconds (pydantic never revalidates instances).
The route's signature is untouched, so the OpenAPI document and FastAPI's own error shapes (the
`loc` paths that errors.py turns into `param`) stay as they were.

Parsing tries pydantic's JSON parser (jiter) first: it is several times faster than `json.loads`
on a big prompt, and where it accepts a text it reads it as `json` does. What it refuses (lone
surrogates, bytes that are not UTF-8, malformed JSON) goes through `json.loads` of the body decoded
with surrogateescape, which keeps today's answers to those bodies (see unicode.py).
"""

from __future__ import annotations

import email.message
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic_core import from_json
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException


def parse_json(body: bytes) -> Any:
    try:
        return from_json(body)
    except ValueError:
        return json.loads(body.decode("utf-8", "surrogateescape"))


def is_json(request: Request) -> bool:
    """FastAPI's own test of the content type (a body of any other type is not parsed as JSON)."""
    content_type = request.headers.get("content-type")
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


class _ParsedRequest(Request):
    """Its json() is the body parsed off the loop (or, for FastAPI's fallbacks, surrogateescape-decoded)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = await run_in_threadpool(parse_json, await self.body())
        return self._json


class OffLoopBodyRoute(APIRoute):
    """A route whose JSON body is parsed and validated on a worker thread (see the module's docstring)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        field = self.body_field

        def parse_and_validate(chunks: list[bytes]) -> tuple[bytes, Any]:
            body = b"".join(chunks)  # a big join releases the GIL, so it too is off the loop's way
            if not body:
                return body, None
            try:
                data = parse_json(body)
            except json.JSONDecodeError as e:  # the error FastAPI itself would raise
                raise RequestValidationError(
                    [{"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error", "input": {},
                      "ctx": {"error": e.msg}}], body=e.doc) from e
            value, errors = field.validate(data, {}, loc=("body",))
            if errors:
                raise RequestValidationError(errors, body=data)
            return body, value

        async def route(request: Request) -> Response:
            request = _ParsedRequest(request.scope, request.receive)
            # Only single-model JSON bodies (every POST route here); anything else is FastAPI's as before.
            if field is not None and not self._embed_body_fields and is_json(request):
                try:
                    chunks = [chunk async for chunk in request.stream()]  # bounded: a 413 past the body limit
                except HTTPException:
                    raise
                except Exception as e:  # a client gone mid-body: FastAPI's answer
                    raise HTTPException(400, "There was an error parsing the body") from e
                # Starlette's Request keeps the body and its JSON in these, and FastAPI reads them from there.
                request._body, value = await run_in_threadpool(parse_and_validate, chunks)
                if request._body:
                    request._json = value
            return await handler(request)

        return route
