"""CloudEvents 1.0 in and out of the sidecar (HTTP binding, binary and structured modes; JSON format).

The CloudEvents SDK (``cloudevents``) validates the attributes and does the HTTP binding's header
encoding; this module maps events to messages and back:

* in: every attribute but ``datacontenttype`` is stored as the message header ``ce-<name>`` (the
  name the binary mode gives it), except the distributed tracing extension's ``traceparent`` and
  ``tracestate``, which are the message's trace context (:mod:`bucketq.sidecar.tracecontext`), and
  the partitioning extension's ``partitionkey``, which is the message's key; ``datacontenttype`` is
  the message's content type; JSON data stays a JSON payload, other data is stored as bytes;
* out: a message published as an event is rendered with its own attributes; any other gets
  ``id`` (the message id), ``source`` ``/bucketq/topics/<topic>``, ``type`` ``io.bucketq.message``
  and ``time`` (when it was published). Both carry ``partitionkey`` (the key), the trace context,
  and ``bucketqdeliveries`` (deliveries so far); a pulled event also ``bucketqreceipt`` and
  ``bucketqleaseuntil`` (what ack, nack and extend need). Message headers that are not ``ce-``
  attributes or trace context are not rendered (their names are no CloudEvents attribute names).

JSON bodies reach the SDK only after the sidecar's own checks (body, value and depth limits).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from cloudevents.core.bindings.http import HTTPMessage, from_binary, from_structured, to_binary, to_structured
from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from bucketq.core.message import Message
from bucketq.sidecar.errors import ApiError
from bucketq.sidecar.tracecontext import TRACEPARENT, TRACESTATE, trace_headers

STRUCTURED = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"
PREFIX = "ce-"
DEFAULT_TYPE = "io.bucketq.message"
PARTITION_KEY = "partitionkey"  # the CloudEvents partitioning extension
_JSON_TYPE = re.compile(r"^(application|text)/([a-zA-Z0-9\-.]+\+)?json(;.*)?$")
_FORMAT = JSONFormat()


def is_json_type(content_type: str | None) -> bool:
    return content_type is None or bool(_JSON_TYPE.match(content_type))


def is_binary_event(headers: Mapping[str, str]) -> bool:
    """A request in binary mode: its attributes are ``ce-`` headers (``ce-specversion`` says so)."""
    return any(name.lower() == "ce-specversion" for name in headers)


# -- in ----------------------------------------------------------------------------------------------


def _invalid(exc: Exception) -> ApiError:
    return ApiError(400, "invalid_cloudevent", f"not a valid CloudEvent: {exc}")


def from_binary_request(headers: Mapping[str, str], data: Any, content_type: str | None) -> dict[str, Any]:
    """The message fields of a binary-mode event whose body the caller parsed already (``data``:
    JSON value, or bytes)."""
    ce_headers = {k: v for k, v in headers.items() if k.lower().startswith(PREFIX)}
    if content_type:
        ce_headers["content-type"] = content_type
    try:
        event = from_binary(HTTPMessage(ce_headers, b""), _FORMAT, CloudEvent)
    except (BaseCloudEventException, ValueError, OverflowError) as exc:
        raise _invalid(exc) from None
    return _fields(event.get_attributes(), data)


def from_structured_body(raw: bytes, parsed: Any) -> dict[str, Any]:
    """The message fields of a structured-mode event (``parsed``: the body, checked and parsed)."""
    if not isinstance(parsed, dict):
        raise ApiError(400, "invalid_cloudevent", "a structured CloudEvent is a JSON object")
    try:
        event = from_structured(HTTPMessage({}, raw), _FORMAT, CloudEvent)
    except (BaseCloudEventException, ValueError, OverflowError, TypeError) as exc:
        raise _invalid(exc) from None
    attributes = event.get_attributes()
    data = event.get_data()
    if not isinstance(data, bytes) and not is_json_type(attributes.get("datacontenttype")):
        data = b"" if data is None else str(data).encode()  # text/plain "hello" is the bytes hello
    return _fields(attributes, data)


def from_batch_body(items: Any) -> list[dict[str, Any]]:
    """The message fields of each event of a structured batch (``items``: the body, parsed)."""
    import json

    if not isinstance(items, list) or not items:
        raise ApiError(400, "invalid_cloudevent", "a CloudEvents batch is a non-empty JSON array of events")
    return [from_structured_body(json.dumps(item).encode(), item) for item in items]


def _fields(attributes: Mapping[str, Any], data: Any) -> dict[str, Any]:
    """OutgoingMessage fields of an event's attributes and data (bytes or a JSON value)."""
    headers: dict[str, str] = {}
    key: str | None = None
    for name, value in attributes.items():
        if name == "datacontenttype" or value is None:
            continue
        if name == PARTITION_KEY:
            key = str(value)
        elif name in (TRACEPARENT, TRACESTATE):
            headers[name] = str(value)
        else:
            headers[PREFIX + name] = _text(value)
    headers = {k: v for k, v in headers.items() if k.startswith(PREFIX)} | trace_headers(headers)
    fields: dict[str, Any] = {"headers": headers}
    content_type = attributes.get("datacontenttype")
    if isinstance(data, bytes | bytearray):
        fields["data_b64"] = base64.b64encode(bytes(data)).decode()
        fields["content_type"] = content_type or "application/octet-stream"
    else:
        fields["payload"] = data
        fields["content_type"] = content_type or "application/json"
    if key is not None:
        fields["key"] = key
    return fields


def _text(value: Any) -> str:
    if isinstance(value, datetime):
        text = value.isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# -- out ---------------------------------------------------------------------------------------------


def to_event(msg: Message, *, receipt: bool) -> CloudEvent:
    """The CloudEvent of a delivered message (with its receipt and lease deadline when pulled)."""
    attributes: dict[str, Any] = {}
    for name, value in msg.headers.items():
        if name.startswith(PREFIX) and re.fullmatch(r"[a-z0-9]+", name[len(PREFIX) :]):
            attr = name[len(PREFIX) :]
            attributes[attr] = _parse_time(value) if attr == "time" else value
    attributes.setdefault("specversion", "1.0")
    attributes.setdefault("id", msg.id)
    attributes.setdefault("source", f"/bucketq/topics/{msg.topic}")
    attributes.setdefault("type", DEFAULT_TYPE)
    attributes.setdefault("time", datetime.fromtimestamp(msg.created_at, UTC))
    attributes["datacontenttype"] = msg.content_type
    if msg.key is not None:
        attributes[PARTITION_KEY] = msg.key
    attributes.update(trace_headers(msg.headers))
    attributes["bucketqdeliveries"] = msg.deliveries
    if receipt:
        attributes["bucketqreceipt"] = msg.receipt
        attributes["bucketqleaseuntil"] = _text(datetime.fromtimestamp(msg.lease_until, UTC))
    data: Any = msg.data if msg.data is not None else msg.payload
    try:
        return CloudEvent(attributes, data)
    except BaseCloudEventException:
        # attributes stored by an older publish that no longer validate: the defaults, not a failure
        fallback = {
            k: v for k, v in attributes.items() if k not in ("id", "source", "type", "time", "specversion")
        }
        fallback |= {"id": msg.id, "source": f"/bucketq/topics/{msg.topic}", "type": DEFAULT_TYPE}
        return CloudEvent(fallback, data)


def _parse_time(value: str) -> Any:
    try:
        parsed = datetime.fromisoformat(value)  # RFC 3339, as CloudEvents writes time
    except ValueError:
        return value
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def structured(event: CloudEvent) -> tuple[dict[str, str], bytes]:
    """Headers and body of one event in structured mode."""
    message = to_structured(event, _FORMAT)
    return dict(message.headers), message.body


def batch(events: Sequence[CloudEvent]) -> tuple[dict[str, str], bytes]:
    """Headers and body of a structured batch (a JSON array, of any length)."""
    return {"content-type": BATCH}, b"[" + b",".join(_FORMAT.write(e) for e in events) + b"]"


def binary(event: CloudEvent) -> tuple[dict[str, str], bytes]:
    """Headers (``ce-*``, Content-Type) and body (the data) of one event in binary mode."""
    message = to_binary(event, _FORMAT)
    return dict(message.headers), message.body
