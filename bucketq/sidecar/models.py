"""Request and response bodies of the localhost API (shared by the sidecar and ``bucketq.client``).

This module depends on pydantic only, so that applications can use the client without the engine.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictInt,
    field_validator,
    model_serializer,
    model_validator,
)

PushStatus = Literal["SUCCESS", "RETRY", "DROP"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
    data_b64: str | None = Field(None, description="Raw bytes, base64 (give this or payload).")
    content_type: str | None = Field(
        None, description="Default application/json for payload, application/octet-stream for data."
    )
    key: str | None = Field(None, description="Partition key: messages with one key keep their order.")
    headers: dict[str, str] = Field(default_factory=dict)
    dedup_id: str | None = Field(
        None, min_length=1, description="Idempotent publish: a repeat within the window is not stored again."
    )
    priority: StrictInt = Field(0, description="Lower is delivered first among visible messages.")
    delay_seconds: float | None = Field(None, ge=0, le=366 * 24 * 3600, description="Invisible until then.")
    not_before: float | None = Field(None, description="Invisible until this unix time.")

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
        return self

    def data(self) -> bytes | None:
        return None if self.data_b64 is None else base64.b64decode(self.data_b64)


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
    wait_seconds: float = Field(
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
    receipt: str = Field(min_length=1)


class AckBatchRequest(_Strict):
    receipts: list[str] = Field(min_length=1)


class NackRequest(_Strict):
    """Requeue (visible again after ``delay_seconds``), or with ``requeue: false`` dead-letter."""

    receipt: str = Field(min_length=1)
    requeue: bool = True
    delay_seconds: float = Field(0.0, ge=0, le=366 * 24 * 3600)
    reason: str | None = Field(None, max_length=1000)


class NackBatchRequest(_Strict):
    entries: list[NackRequest] = Field(min_length=1)


class ExtendRequest(_Strict):
    receipt: str = Field(min_length=1)
    seconds: float = Field(gt=0, le=12 * 3600)


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
