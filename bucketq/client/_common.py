"""What the sync and async clients share: the default URL and request bodies."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, Unpack
from urllib.parse import quote

from bucketq.api_models import ExtendRequest, NackRequest, OutgoingMessage
from bucketq.publish_options import PublishFields, PublishOptions, resolve_options

URL_ENV = "BUCKETQ_SIDECAR_URL"
DEFAULT_URL = "http://127.0.0.1:3580"


def default_url() -> str:
    """``$BUCKETQ_SIDECAR_URL``, else the sidecar's default address."""
    return os.environ.get(URL_ENV, DEFAULT_URL).rstrip("/")


def message(
    payload: Any = None,
    *,
    data: bytes | None = None,
    options: PublishOptions | None = None,
    **fields: Unpack[PublishFields],
) -> OutgoingMessage:
    """A message to publish: a JSON ``payload`` or raw ``data`` bytes, and the options of
    :class:`~bucketq.PublishOptions` as keyword arguments or as one ``options`` value (validated
    here: a bad field raises pydantic's ValidationError, a ValueError)."""
    return OutgoingMessage.build(payload, data=data, options=resolve_options(options, **fields))


def wire(m: OutgoingMessage) -> dict[str, Any]:
    return m.model_dump(mode="json", exclude_unset=True)


def batch_body(messages: Iterable[OutgoingMessage | Mapping[str, Any]]) -> dict[str, Any]:
    items = [
        m if isinstance(m, OutgoingMessage) else OutgoingMessage.model_validate(dict(m)) for m in messages
    ]
    return {"messages": [wire(m) for m in items]}


def nack_entries(entries: Iterable[NackRequest | Mapping[str, Any]]) -> dict[str, Any]:
    items = [e if isinstance(e, NackRequest) else NackRequest.model_validate(dict(e)) for e in entries]
    return {"entries": [e.model_dump(mode="json", exclude_none=True) for e in items]}


def extend_entries(entries: Iterable[ExtendRequest | Mapping[str, Any]]) -> dict[str, Any]:
    items = [e if isinstance(e, ExtendRequest) else ExtendRequest.model_validate(dict(e)) for e in entries]
    return {"entries": [e.model_dump(mode="json") for e in items]}


def publish_path(topic: str, *, batch: bool = False) -> str:
    return f"/v1/publish/{quote(topic, safe='')}" + ("/batch" if batch else "")


def nack_body(receipt: str, requeue: bool, delay: float, reason: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"receipt": receipt, "requeue": requeue, "delay_seconds": delay}
    if reason is not None:
        body["reason"] = reason
    return body
