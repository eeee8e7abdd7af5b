"""What a publish request holds: the JSON envelope, a raw body of any type, or CloudEvents.

``POST /v1/publish/{topic}`` is read by its ``Content-Type`` (docs/sidecar-api.md, "Publishing"):

* ``application/json``: the envelope ``{"payload": ..., "key": ...}`` (:class:`OutgoingMessage`), or
  with ``?raw=true`` the body itself as the JSON payload;
* ``ce-specversion`` among the headers: a CloudEvent in binary mode (``ce-*`` headers, the body its
  data); ``application/cloudevents+json``: a CloudEvent in structured mode;
* anything else: the body is the message, stored with that content type, as a JSON payload when
  the type is JSON (``application/problem+json``, ``text/json``), else as bytes.

``.../batch`` takes the envelope batch or ``application/cloudevents-batch+json``. The options a raw
body or an event has no field for come as query parameters of the same names as the envelope's
(``key``, ``dedup_id``, ``priority``, ``delay_seconds``, ``not_before``); an envelope carries its
own and refuses them. Every message is finally an :class:`OutgoingMessage`, validated as the
envelope is, with the request's trace context added (:func:`~bucketq.sidecar.tracecontext.with_trace`).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from bucketq.api_models import OutgoingMessage, PublishBatchRequest
from bucketq.sidecar import cloud_events
from bucketq.sidecar.errors import ApiError, invalid_body
from bucketq.sidecar.httputil import LIMITS, parse_json, read_bytes, read_model
from bucketq.sidecar.tracecontext import with_trace

ENVELOPE = "application/json"
QUERY_OPTIONS = {"key": str, "dedup_id": str, "priority": int, "delay_seconds": float, "not_before": float}
TRUE = frozenset({"true", "1", "yes"})


async def read_publish(request: web.Request, trace: Mapping[str, str]) -> OutgoingMessage:
    """The one message of ``POST /v1/publish/{topic}``."""
    options = query_options(request)
    raw = request.query.get("raw", "").lower() in TRUE
    if cloud_events.is_binary_event(request.headers):
        body = await read_bytes(request)
        fields = cloud_events.from_binary_request(
            request.headers, _data(request, body), request.headers.get("Content-Type")
        )
    elif request.content_type == cloud_events.STRUCTURED:
        body = await read_bytes(request)
        fields = cloud_events.from_structured_body(body, parse_json(body, request.app[LIMITS]))
    elif request.content_type == ENVELOPE and not raw:
        if options:
            raise ApiError(
                400,
                "invalid_request",
                f"query options {sorted(options)} are for raw bodies and CloudEvents: "
                "an envelope gives them as its own fields",
            )
        return _traced(await read_model(request, OutgoingMessage), trace)
    else:
        body = await read_bytes(request)
        data = _data(request, body)
        key = "data_b64" if isinstance(data, bytes) else "payload"
        value = base64.b64encode(data).decode() if isinstance(data, bytes) else data
        fields = {key: value, "content_type": request.headers.get("Content-Type", "application/octet-stream")}
    return _traced(_message({**fields, **options}), trace)


async def read_publish_batch(request: web.Request, trace: Mapping[str, str]) -> list[OutgoingMessage]:
    """The messages of ``POST /v1/publish/{topic}/batch``."""
    if request.content_type == cloud_events.BATCH:
        options = query_options(request)
        body = await read_bytes(request)
        items = parse_json(body, request.app[LIMITS])
        if isinstance(items, list) and len(items) > request.app[LIMITS].max_items:
            raise ApiError(
                413,
                "batch_too_large",
                f"{len(items)} events in one batch; the limit is {request.app[LIMITS].max_items}",
            )
        return [_traced(_message({**f, **options}), trace) for f in cloud_events.from_batch_body(items)]
    if request.content_type != ENVELOPE:
        raise ApiError(
            415,
            "unsupported_media_type",
            "a batch is the JSON envelope ('Content-Type: application/json') or a CloudEvents batch "
            f"('{cloud_events.BATCH}'), got {request.content_type!r}",
        )
    batch = await read_model(request, PublishBatchRequest, items="messages")
    return [_traced(m, trace) for m in batch.messages]


def query_options(request: web.Request) -> dict[str, Any]:
    """The publish options given as query parameters (typed; 400 for a bad one)."""
    out: dict[str, Any] = {}
    for name, value in request.query.items():
        if name == "raw":
            continue
        kind = QUERY_OPTIONS.get(name)
        if kind is None:
            raise ApiError(
                400,
                "invalid_request",
                f"unknown query parameter {name!r}; known: raw, {', '.join(QUERY_OPTIONS)}",
            )
        try:
            out[name] = kind(value)
        except ValueError:
            raise ApiError(
                400, "invalid_request", f"query parameter {name}={value!r} is not a {kind.__name__}"
            ) from None
    return out


def _data(request: web.Request, body: bytes) -> Any:
    """A raw body as stored: the parsed JSON value for a JSON type, else the bytes."""
    content_type = request.headers.get("Content-Type")
    if content_type is not None and cloud_events.is_json_type(content_type):
        return parse_json(body, request.app[LIMITS])
    return body


def _message(fields: dict[str, Any]) -> OutgoingMessage:
    try:
        return OutgoingMessage.model_validate(fields)
    except ValidationError as exc:
        raise invalid_body(exc, "message") from None


def _traced(message: OutgoingMessage, trace: Mapping[str, str]) -> OutgoingMessage:
    if not trace:
        return message
    return message.model_copy(update={"headers": with_trace(message.headers, trace)})
