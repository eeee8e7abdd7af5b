"""Segment format (JSON Lines): one header line, then one line per message (DESIGN.md 2.2)."""

from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bucketq.core.ids import message_id
from bucketq.errors import InvalidMessage, MessageTooLarge, StorageError

FORMAT_VERSION = 1
JSON_CONTENT_TYPE = "application/json"


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


@dataclass(frozen=True, slots=True)
class Record:
    """One message as stored in a segment."""

    id: str
    key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    payload: Any = None
    data: bytes | None = None
    content_type: str = JSON_CONTENT_TYPE
    created_at: float = 0.0
    producer_id: str | None = None
    priority: int = 0
    not_before: float | None = None
    dedup_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "key": self.key, "headers": dict(self.headers)}
        if self.data is not None:
            out["data_b64"] = base64.b64encode(self.data).decode()
        else:
            out["payload"] = self.payload
        out.update(
            content_type=self.content_type,
            created_at=self.created_at,
            producer_id=self.producer_id,
            priority=self.priority,
            not_before=self.not_before,
            dedup_id=self.dedup_id,
        )
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Record:
        data_b64 = obj.get("data_b64")
        return cls(
            id=obj["id"],
            key=obj.get("key"),
            headers=obj.get("headers") or {},
            payload=obj.get("payload"),
            data=base64.b64decode(data_b64) if data_b64 is not None else None,
            content_type=obj.get("content_type") or JSON_CONTENT_TYPE,
            created_at=float(obj.get("created_at") or 0.0),
            producer_id=obj.get("producer_id"),
            priority=int(obj.get("priority") or 0),
            not_before=obj.get("not_before"),
            dedup_id=obj.get("dedup_id"),
        )


def build_record(
    payload: Any = None,
    *,
    data: bytes | None = None,
    content_type: str | None = None,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
    producer_id: str | None = None,
    priority: int = 0,
    not_before: float | None = None,
    delay: float | None = None,
    dedup_id: str | None = None,
    id: str | None = None,
    created_at: float | None = None,
) -> Record:
    """Validate the parts of a new message and build its record (raises InvalidMessage)."""
    if data is not None and payload is not None:
        raise InvalidMessage("give either a JSON payload or raw data, not both")
    if data is not None and not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidMessage(f"data must be bytes, got {type(data).__name__}")
    if key is not None and not isinstance(key, str):
        raise InvalidMessage(f"key must be a string, got {type(key).__name__}")
    hdrs = dict(headers or {})
    for name, value in hdrs.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidMessage(f"header {name!r} must map a string to a string")
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise InvalidMessage("priority must be an integer (lower is delivered first)")
    if delay is not None:
        if not isinstance(delay, int | float) or delay < 0 or not math.isfinite(delay):
            raise InvalidMessage("delay must be a non-negative number of seconds")
        not_before = time.time() + float(delay)
    if not_before is not None and (not isinstance(not_before, int | float) or not math.isfinite(not_before)):
        raise InvalidMessage("not_before must be a unix timestamp")
    if dedup_id is not None and (not isinstance(dedup_id, str) or not dedup_id):
        raise InvalidMessage("dedup_id must be a non-empty string")
    if data is None:
        try:
            _dumps(payload)
        except (TypeError, ValueError) as exc:
            raise InvalidMessage(f"payload is not JSON-serialisable: {exc}") from None
    ctype = content_type or (JSON_CONTENT_TYPE if data is None else "application/octet-stream")
    return Record(
        id=id or message_id(),
        key=key,
        headers=hdrs,
        payload=payload if data is None else None,
        data=bytes(data) if data is not None else None,
        content_type=ctype,
        created_at=created_at if created_at is not None else time.time(),
        producer_id=producer_id,
        priority=priority,
        not_before=float(not_before) if not_before is not None else None,
        dedup_id=dedup_id,
    )


def encode_record(record: Record, max_bytes: int) -> bytes:
    """The record's JSON line (without newline), checked against the topic's size limit."""
    try:
        line = _dumps(record.to_json()).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidMessage(f"message cannot be encoded: {exc}") from None
    if len(line) > max_bytes:
        raise MessageTooLarge(len(line), max_bytes)
    return line


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    """Line 1 of a segment. ``base`` is the partition offset of its first message; ``batch`` a nonce."""

    topic: str
    partition: int
    seq: int
    count: int
    base: int
    producer_id: str | None
    created_at: float
    batch: str

    def to_json(self) -> dict[str, Any]:
        return {
            "v": FORMAT_VERSION,
            "topic": self.topic,
            "partition": self.partition,
            "seq": self.seq,
            "producer_id": self.producer_id,
            "created_at": self.created_at,
            "count": self.count,
            "base": self.base,
            "batch": self.batch,
        }


@dataclass(frozen=True, slots=True)
class Segment:
    header: SegmentHeader
    records: list[Record]


def encode_segment(header: SegmentHeader, lines: list[bytes]) -> bytes:
    return b"\n".join([_dumps(header.to_json()).encode(), *lines]) + b"\n"


def decode_header(data: bytes) -> SegmentHeader:
    first = data.split(b"\n", 1)[0]
    try:
        obj = json.loads(first)
        return SegmentHeader(
            topic=obj["topic"],
            partition=int(obj["partition"]),
            seq=int(obj["seq"]),
            count=int(obj["count"]),
            base=int(obj.get("base", 0)),
            producer_id=obj.get("producer_id"),
            created_at=float(obj.get("created_at") or 0.0),
            batch=str(obj.get("batch", "")),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise StorageError(f"corrupt segment header: {exc}") from None


def decode_segment(data: bytes) -> Segment:
    header = decode_header(data)
    lines = data.split(b"\n")[1:]
    records = [Record.from_json(json.loads(line)) for line in lines if line.strip()]
    if len(records) != header.count:
        raise StorageError(
            f"corrupt segment {header.topic}/p{header.partition}/{header.seq}: "
            f"header says {header.count} messages, found {len(records)}"
        )
    return Segment(header, records)
