"""HTTP plumbing of the API: JSON bodies in and out, JSON errors, bearer-token auth."""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import web
from aiohttp.typedefs import Middleware
from pydantic import BaseModel, ValidationError

from bucketq.sidecar.errors import ApiError, from_exception, invalid_body

log = logging.getLogger("bucketq.sidecar.http")

M = TypeVar("M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
MAX_BODY = web.AppKey("max_body", int)


def json_response(model: BaseModel, status: int = 200) -> web.Response:
    return web.Response(
        status=status, text=model.model_dump_json(exclude_none=True), content_type="application/json"
    )


async def read_model(request: web.Request, model: type[M], *, empty_ok: bool = False) -> M:
    """The body as ``model``: 415 unless JSON, 413 over the size limit, 400 malformed or invalid."""
    if not request.can_read_body and empty_ok:
        return model()
    if request.content_type != "application/json":
        raise ApiError(
            415,
            "unsupported_media_type",
            f"send the body as JSON with 'Content-Type: application/json' (got {request.content_type!r})",
        )
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise ApiError(
            413,
            "body_too_large",
            f"request body is larger than the limit of {request.app[MAX_BODY]} bytes",
        ) from exc
    if not raw.strip() and empty_ok:
        return model()
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, "malformed_json", f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(
            400, "invalid_request", f"request body must be a JSON object, got {type(data).__name__}"
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid_body(exc, "request body") from None


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error answers JSON ``{"error": code, "message": ...}``."""
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(
            exc.status, "http_error"
        )
        message = {
            404: f"no such endpoint: {request.method} {request.path}",
            405: f"method {request.method} is not allowed on {request.path}",
        }.get(exc.status, exc.reason)
        return ApiError(exc.status, code, message).response()
    except Exception as exc:
        log.exception("error serving %s %s", request.method, request.path)
        return from_exception(exc).response()


def auth_middleware(token: str) -> Middleware:
    """Require ``Authorization: Bearer <token>`` on the API (probes and metrics stay open)."""
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in OPEN_PATHS:
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                raise ApiError(
                    401,
                    "unauthorized",
                    "missing or wrong bearer token (header 'Authorization: Bearer ...')",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return await handler(request)

    return middleware
