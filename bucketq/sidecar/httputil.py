"""HTTP plumbing of the API: JSON bodies in and out, JSON errors, bearer-token auth."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.typedefs import Middleware
from pydantic import BaseModel, ValidationError

from bucketq.sidecar.errors import ApiError, from_exception, invalid_body

log = logging.getLogger("bucketq.sidecar.http")

M = TypeVar("M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
MAX_BODY = web.AppKey("max_body", int)


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """What one request body may hold; checked before and while it is parsed."""

    max_bytes: int
    max_values: int
    max_depth: int
    max_items: int  # entries of a batch list (messages, receipts, entries)
    read_timeout_s: float


LIMITS = web.AppKey("body_limits", BodyLimits)

# A JSON string token (with escapes); DOTALL so that a stray control byte cannot split one in two.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def count_json_values(raw: bytes, limit: int) -> int:
    """An upper bound of the JSON values ``json.loads(raw)`` would build, or any number above
    ``limit`` once it is sure to exceed it, without building them.

    Every value but the first of an array or object follows a ',' and every container opens with
    '[' or '{', so counting those outside strings bounds the values (and object keys) parsed. For
    malformed input it bounds what the parser builds before it stops at the error, because up to
    that point it tokenizes strings exactly as this does. Only bodies with many ',' '[' '{' pay for
    the exact count, and only when they hold few enough strings for it to be cheap (the regex
    costs about a microsecond per string, and it runs on the event loop).
    """
    quick = raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1
    if quick <= limit or b'"' not in raw:
        return quick
    # each string is a value or a key (and a key comes with a value): at most 2 strings per value.
    # An escaped quote shows as \" (as does an escaped backslash before a closing quote, hence
    # this is a lower bound of the real delimiters).
    strings_at_least = (raw.count(b'"') - raw.count(b'\\"')) // 2
    if strings_at_least > 2 * limit:
        return quick
    stripped = _STRING.sub(b"", raw)
    return stripped.count(b",") + stripped.count(b"[") + stripped.count(b"{") + 1


def _reject_constant(name: str) -> Any:
    # NaN and Infinity are not JSON; Python's parser accepts them unless told otherwise
    raise ValueError(f"{name} is not valid JSON")


def json_depth(data: Any, limit: int) -> bool:
    """True when ``data`` nests no deeper than ``limit`` (iterative: no recursion to exhaust)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return False
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    return True


def json_response(model: BaseModel, status: int = 200) -> web.Response:
    return web.Response(
        status=status, text=model.model_dump_json(exclude_none=True), content_type="application/json"
    )


async def read_model(
    request: web.Request, model: type[M], *, empty_ok: bool = False, items: str | None = None
) -> M:
    """The body as ``model``: 415 unless JSON, 413 over a size limit, 400 malformed or invalid.

    ``items`` names the batch list field of ``model``: more entries than the batch limit are
    refused with 413 before any entry is validated.
    """
    limits = request.app[LIMITS]
    refuse_content_encoding(request)
    if not request.can_read_body and empty_ok:
        return model()
    if request.content_type != "application/json":
        raise ApiError(
            415,
            "unsupported_media_type",
            f"send the body as JSON with 'Content-Type: application/json' (got {request.content_type!r})",
        )
    raw = await read_bytes(request)
    if not raw.strip() and empty_ok:
        return model()
    data = parse_json(raw, limits)
    if not isinstance(data, dict):
        raise ApiError(
            400, "invalid_request", f"request body must be a JSON object, got {type(data).__name__}"
        )
    entries = data.get(items) if items is not None else None
    if isinstance(entries, list) and len(entries) > limits.max_items:
        raise ApiError(
            413,
            "batch_too_large",
            f"{len(entries)} entries in one batch; the limit is {limits.max_items}",
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid_body(exc, "request body") from None
    except (ValueError, RecursionError) as exc:  # a validator choking on odd input: still the client's
        raise ApiError(400, "invalid_request", f"invalid request body: {exc}") from None


async def read_bytes(request: web.Request) -> bytes:
    """The whole body, within the body limit and the body timeout (413 over it, 408 too slow);
    415 when it was sent compressed (refused unread, never inflated)."""
    refuse_content_encoding(request)
    limits = request.app[LIMITS]
    try:
        # a client that sends the head and then trickles the body must not hold a handler forever
        return await asyncio.wait_for(request.read(), limits.read_timeout_s)
    except web.HTTPRequestEntityTooLarge as exc:
        raise ApiError(
            413,
            "body_too_large",
            f"request body is larger than the limit of {limits.max_bytes} bytes",
        ) from exc
    except TimeoutError:
        err = ApiError(
            408, "request_timeout", f"the request body did not arrive within {limits.read_timeout_s:g}s"
        )
        _answer_and_close(request, err)
        raise err from None


def parse_json(raw: bytes, limits: BodyLimits) -> Any:
    """``raw`` parsed as strict JSON within the value and depth limits (413/400 otherwise)."""
    values = count_json_values(raw, limits.max_values)
    if values > limits.max_values:
        raise ApiError(
            413,
            "too_many_values",
            f"request body holds more than {limits.max_values} JSON values (the limit)",
        )
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, "malformed_json", f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ApiError(
            400, "too_deep", f"request body nests deeper than the limit of {limits.max_depth}"
        ) from None
    except ValueError as exc:  # an integer of more than 4300 digits, NaN or Infinity
        raise ApiError(400, "malformed_json", f"request body is not acceptable JSON: {exc}") from None
    if not json_depth(data, limits.max_depth):
        # deeper values could exhaust the stack when the message is encoded for the bucket
        raise ApiError(400, "too_deep", f"request body nests deeper than the limit of {limits.max_depth}")
    return data


def refuse_content_encoding(request: web.Request) -> None:
    """415 for a body sent with a Content-Encoding other than ``identity``.

    Bodies are bounded as they arrive (``client_max_size``), which only means something for bytes
    that are what the handler parses: a compressed body of 1 MiB can inflate to 1 GiB. The server
    runs with aiohttp's ``auto_decompress=False`` and refuses such bodies unread, so no request
    costs more memory than the body limit (issue: compressed bodies bypassed it). JSON bodies on a
    localhost API gain nothing from compression.
    """
    codings = [
        coding.strip().lower()
        for header in request.headers.getall("Content-Encoding", ())
        for coding in header.split(",")
    ]
    refused = [coding for coding in codings if coding and coding != "identity"]
    if refused:
        raise ApiError(
            415,
            "unsupported_content_encoding",
            f"request bodies are not accepted compressed (Content-Encoding: {', '.join(refused)}): "
            "send them uncompressed, without a Content-Encoding header or with 'identity'",
            headers={"Accept-Encoding": "identity"},
        )


def _answer_and_close(request: web.Request, err: ApiError) -> None:
    """Send ``err`` and close the connection now. An ordinary answer would make aiohttp read (and
    wait for) the rest of the unread body first, which is what a slow client wants."""
    transport = request.transport
    if transport is None:
        return
    body = json.dumps(err.body()).encode()
    transport.write(
        b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n\r\n%s" % (err.status, b"Request Timeout", len(body), body)
    )
    request.protocol.force_close()  # closing the transport flushes what was written first


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
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None  # 405 must say
        return ApiError(exc.status, code, message, headers=allow).response()
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
