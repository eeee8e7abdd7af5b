"""Request and response bodies of the sidecar's localhost API, shared by the server and the client.

It lives outside both :mod:`bucketq.sidecar` (the server) and :mod:`bucketq.client` so that neither
package imports the other: the wire format is their only contract. It depends on pydantic only (and
the dependency-free :mod:`bucketq.publish_options`), so that applications can use the client
without the engine.
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_serializer,
    model_validator,
)

from bucketq.publish_options import DEFAULT_OPTIONS, PublishOptions

PushStatus = Literal["SUCCESS", "RETRY", "DROP"]

# Bounds of the request fields. Priorities sort messages within a partition; the engine takes any
# integer, the API a documented range (an integer of thousands of digits is nobody's priority).
MIN_PRIORITY = -1000
MAX_PRIORITY = 1000
MAX_DELAY_S = 366 * 24 * 3600
MAX_EXTEND_S = 12 * 3600
MAX_RECEIPT_CHARS = 512  # topic (<= 253) + three integers + a token, with room


class _Strict(BaseModel):
    # extra fields are refused; NaN and Infinity are no numbers a field could mean
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# -- errors --------------------------------------------------------------------------------------


class ErrorBody(_Strict):
    """Every 4xx/5xx answer: a machine-readable code and a sentence naming the problem."""

    error: str
    message: str
    details: list[dict[str, Any]] | None = None


# -- publish -------------------------------------------------------------------------------------


class OutgoingMessage(_Strict):
    """One message to publish: a JSON ``payload`` or base64 ``data_b64`` (exactly one)."""

    payload: Any = Field(None, description="Any JSON value (give this or data_b64).")
    data_b64: StrictStr | None = Field(None, description="Raw bytes, base64 (give this or payload).")
    content_type: StrictStr | None = Field(
        None, description="Default application/json for payload, application/octet-stream for data."
    )
    key: StrictStr | None = Field(None, description="Partition key: messages with one key keep their order.")
    headers: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    dedup_id: StrictStr | None = Field(
        None, min_length=1, description="Idempotent publish: a repeat within the window is not stored again."
    )
    priority: StrictInt = Field(
        0,
        ge=MIN_PRIORITY,
        le=MAX_PRIORITY,
        description="Lower is delivered first among visible messages (-1000 to 1000).",
    )
    delay_seconds: StrictFloat | None = Field(
        None, ge=0, le=MAX_DELAY_S, description="Invisible for this many seconds (at most 366 days)."
    )
    not_before: StrictFloat | None = Field(
        None,
        ge=0,
        description="Invisible until this unix time (at most 366 days ahead, like delay_seconds).",
    )

    @field_validator("data_b64")
    @classmethod
    def _base64(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError("data_b64 is not valid base64") from None
        return value

    @model_validator(mode="after")
    def _one_body(self) -> OutgoingMessage:
        has_payload = "payload" in self.model_fields_set
        has_data = self.data_b64 is not None
        if not has_payload and not has_data:
            raise ValueError("a message needs 'payload' (any JSON value) or 'data_b64' (base64 bytes)")
        if has_payload and has_data:
            raise ValueError("give either 'payload' or 'data_b64', not both")
        if self.delay_seconds is not None and self.not_before is not None:
            raise ValueError("give either 'delay_seconds' or 'not_before', not both")
        if self.not_before is not None and self.not_before > time.time() + MAX_DELAY_S:
            # the same bound as delay_seconds: a message invisible for centuries is a mistake
            raise ValueError("not_before must be at most 366 days in the future")
        return self

    def data(self) -> bytes | None:
        return None if self.data_b64 is None else base64.b64decode(self.data_b64)

    def options(self) -> PublishOptions:
        """The message's options, as the engine takes them."""
        return PublishOptions(
            key=self.key,
            headers=self.headers,
            dedup_id=self.dedup_id,
            priority=self.priority,
            delay=self.delay_seconds,
            not_before=self.not_before,
            content_type=self.content_type,
        )

    @classmethod
    def build(
        cls, payload: Any = None, *, data: bytes | None = None, options: PublishOptions = DEFAULT_OPTIONS
    ) -> OutgoingMessage:
        """The wire form of a message: a JSON ``payload`` or raw ``data`` bytes, and its options
        (validated here: a bad field raises pydantic's ValidationError, a ValueError)."""
        fields: dict[str, Any] = {"priority": options.priority}
        if data is not None:
            fields["data_b64"] = base64.b64encode(data).decode()
        else:
            fields["payload"] = payload
        optional = {
            "content_type": options.content_type,
            "key": options.key,
            "dedup_id": options.dedup_id,
            "delay_seconds": options.delay,
            "not_before": options.not_before,
        }
        fields.update({k: v for k, v in optional.items() if v is not None})
        if options.headers:
            fields["headers"] = dict(options.headers)
        return cls(**fields)


class PublishBatchRequest(_Strict):
    messages: list[OutgoingMessage] = Field(min_length=1)


class PublishResponse(_Strict):
    """Where a durable message landed; ``duplicate`` when its dedup id matched an earlier publish."""

    id: str
    topic: str
    partition: int
    seq: int
    index: int
    offset: int
    duplicate: bool = False


class PublishEntryResult(_Strict):
    """One entry of a batch, in request order: ``status`` 200 with ``result``, or an error."""

    status: int
    result: PublishResponse | None = None
    error: str | None = None
    message: str | None = None


class PublishBatchResponse(_Strict):
    results: list[PublishEntryResult]
    failed: int


# -- pull and settle -----------------------------------------------------------------------------


class PullRequest(_Strict):
    max_messages: StrictInt = Field(10, ge=1, description="At most this many (limit: max_batch, 1000).")
    wait_seconds: StrictFloat = Field(
        0.0, ge=0, description="Long poll: wait up to this long for the first message."
    )


class DeliveredMessage(_Strict):
    """A leased message as pulled (with ``receipt``) or pushed (without)."""

    id: str
    topic: str
    partition: int
    seq: int
    index: int
    offset: int
    key: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    payload: Any = None
    data_b64: str | None = None
    content_type: str
    created_at: float
    producer_id: str | None = None
    priority: int = 0
    deliveries: int = Field(description="1 on the first delivery; more when redelivered.")
    receipt: str | None = Field(None, description="Opaque lease token for ack/nack/extend (pull only).")
    lease_until: float | None = Field(
        None, description="Unix time the lease ends unless extended (pull only)."
    )

    def data(self) -> bytes | None:
        return None if self.data_b64 is None else base64.b64decode(self.data_b64)

    @model_serializer(mode="wrap")
    def _compact(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Leave out absent receipt/lease/data, but keep ``payload`` (even null) for JSON messages."""
        out: dict[str, Any] = handler(self)
        for name in ("data_b64", "receipt", "lease_until"):
            if out.get(name) is None:
                out.pop(name, None)
        if "data_b64" not in out:
            out.setdefault("payload", None)
        return out


class PullResponse(_Strict):
    messages: list[DeliveredMessage]


class AckRequest(_Strict):
    receipt: StrictStr = Field(min_length=1, max_length=MAX_RECEIPT_CHARS)


class AckBatchRequest(_Strict):
    receipts: list[StrictStr] = Field(min_length=1)


class NackRequest(_Strict):
    """Requeue (visible again after ``delay_seconds``), or with ``requeue: false`` dead-letter."""

    receipt: StrictStr = Field(min_length=1, max_length=MAX_RECEIPT_CHARS)
    requeue: StrictBool = True
    delay_seconds: StrictFloat = Field(0.0, ge=0, le=MAX_DELAY_S)
    reason: StrictStr | None = Field(None, max_length=1000)


class NackBatchRequest(_Strict):
    entries: list[NackRequest] = Field(min_length=1)


class ExtendRequest(_Strict):
    receipt: StrictStr = Field(min_length=1, max_length=MAX_RECEIPT_CHARS)
    seconds: StrictFloat = Field(gt=0, le=MAX_EXTEND_S)


class ExtendBatchRequest(_Strict):
    entries: list[ExtendRequest] = Field(min_length=1)


Outcome = Literal["acked", "nacked", "dead_lettered", "extended"]


class SettleResponse(_Strict):
    receipt: str
    outcome: Outcome
    lease_until: float | None = None


class SettleEntryResult(_Strict):
    """One entry of a batch ack/nack/extend: ``status`` 200 with ``outcome``, or an error (409...)."""

    receipt: str
    status: int
    outcome: Outcome | None = None
    lease_until: float | None = None
    error: str | None = None
    message: str | None = None


class SettleBatchResponse(_Strict):
    results: list[SettleEntryResult]
    failed: int


# -- push ----------------------------------------------------------------------------------------


class PushBatch(_Strict):
    """The body the sidecar POSTs to the app in batch push mode."""

    messages: list[DeliveredMessage]


class PushEntryStatus(BaseModel):
    id: str
    status: str


class PushReply(BaseModel):
    """What the app may answer: one ``status`` for everything, or per-message ``statuses``."""

    status: str | None = None
    statuses: list[PushEntryStatus] | None = None
