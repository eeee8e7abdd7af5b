"""Segment format (JSON Lines): one header line, then one line per message (docs/design.md 2.2)."""

from __future__ import annotations

import base64
import json
import math
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bucketq.core.ids import message_id
from bucketq.errors import BucketqError, InvalidMessage, MessageTooLarge, StorageError

FORMAT_VERSION = 1
# Header "v" of a reference segment (format 5): its lines name columnar chunks instead of holding
# messages (core/refsegment.py). A reader refuses a segment whose "v" it does not know.
REF_VERSION = 2
JSON_CONTENT_TYPE = "application/json"
# The codec of a reference segment's lines (chunk references, core/refsegment.py)
REF_CODEC = "ref"


class UnsupportedSegment(BucketqError):
    """A segment or chunk this version of bucketq cannot read (a newer format, a codec it does
    not know, or pyarrow missing for columnar chunks).

    Never a :class:`StorageError`: readers that enter an undecodable (corrupt) segment as empty
    must not do so with this one. It is refused, loudly, until a version that reads it runs (I19).
    """


class ChunkedSegment(BucketqError):
    """:func:`decode_segment` of a reference segment: its messages are in chunks, which only
    :func:`bucketq.core.refsegment.load_segment` (it reads them from the store) decodes."""


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
    # The topic incarnation the writer appended to (absent in format 1 segments). Readers treat a
    # segment of another incarnation as empty: a writer paused across a topic's deletion and
    # re-creation must not add messages to the new topic (invariant I6, docs/protocol.md).
    incarnation: str | None = None
    # Job commits (docs/protocol.md, "Job commits"): the transaction whose record decides whether
    # this segment is visible, and which chunk of that transaction's manifest it holds. Absent in
    # ordinary segments, which are therefore byte-identical to segments written without them.
    txn: str | None = None
    chunk: int | None = None
    # How the message lines after the header are encoded: absent = plain JSON Lines; "zlib" = one
    # zlib stream of the same lines (the header line itself always stays plain JSON); "ref" = the
    # lines name columnar chunks that hold the messages (a reference segment, format 5).
    codec: str | None = None

    @property
    def is_reference(self) -> bool:
        return self.codec == REF_CODEC

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "v": REF_VERSION if self.is_reference else FORMAT_VERSION,
            "topic": self.topic,
            "partition": self.partition,
            "seq": self.seq,
            "producer_id": self.producer_id,
            "created_at": self.created_at,
            "count": self.count,
            "base": self.base,
            "batch": self.batch,
        }
        if self.incarnation is not None:
            out["inc"] = self.incarnation
        if self.txn is not None:
            out["txn"] = self.txn
        if self.chunk is not None:
            out["chunk"] = self.chunk
        if self.codec is not None:
            out["codec"] = self.codec
        return out


@dataclass(frozen=True, slots=True)
class Segment:
    header: SegmentHeader
    records: list[Record]
    # Set by a reader that resolved the segment's transaction as not visible (aborted, or a chunk
    # that is not part of its committed manifest): every message is skipped (core/txn.py).
    hidden: bool = False


CODECS = ("zlib",)
ZLIB_LEVEL = 1  # JSON Lines shrink 5-10x already at level 1; higher levels cost more CPU than they save


def encode_header(header: SegmentHeader) -> bytes:
    """The header line (without newline)."""
    return _dumps(header.to_json()).encode()


def compress_body(plain: bytes, codec: str | None = None) -> bytes:
    """Message lines (each ending in a newline) encoded with ``codec``."""
    if codec is None:
        return plain
    if codec == "zlib":
        return zlib.compress(plain, ZLIB_LEVEL)
    raise ValueError(f"unknown segment codec {codec!r}: use one of {CODECS}")


def encode_body(lines: list[bytes], codec: str | None = None) -> bytes:
    """Everything after the header line: the message lines, encoded with ``codec``."""
    return compress_body(b"\n".join(lines) + b"\n" if lines else b"", codec)


def encode_segment(header: SegmentHeader, lines: list[bytes]) -> bytes:
    if header.codec is not None:
        return encode_header(header) + b"\n" + encode_body(lines, header.codec)
    return b"\n".join([encode_header(header), *lines]) + b"\n"


def segment_lines(data: bytes, header: SegmentHeader) -> list[bytes]:
    """The message lines of an encoded segment (decompressed when the header names a codec)."""
    body = data.split(b"\n", 1)[1] if b"\n" in data else b""
    if header.codec == REF_CODEC:
        raise ChunkedSegment(
            f"segment {header.topic}/p{header.partition}/{header.seq} references columnar chunks: "
            "read it with bucketq.core.refsegment.load_segment"
        )
    if header.codec == "zlib":
        try:
            body = zlib.decompress(body)
        except zlib.error as exc:
            raise StorageError(
                f"corrupt segment {header.topic}/p{header.partition}/{header.seq}: {exc}"
            ) from None
    elif header.codec is not None:
        raise UnsupportedSegment(
            f"segment {header.topic}/p{header.partition}/{header.seq} has codec {header.codec!r}, "
            "unknown to this bucketq: upgrade bucketq"
        )
    return [line for line in body.split(b"\n") if line.strip()]


def decode_header(data: bytes) -> SegmentHeader:
    first = data.split(b"\n", 1)[0]
    try:
        obj = json.loads(first)
        version = obj.get("v", FORMAT_VERSION)
    except (ValueError, AttributeError) as exc:
        raise StorageError(f"corrupt segment header: {exc}") from None
    if isinstance(version, int) and version > REF_VERSION:
        raise UnsupportedSegment(
            f"segment header version {version} (this bucketq reads up to {REF_VERSION}): upgrade bucketq"
        )
    try:
        return SegmentHeader(
            topic=obj["topic"],
            partition=int(obj["partition"]),
            seq=int(obj["seq"]),
            count=int(obj["count"]),
            base=int(obj.get("base", 0)),
            producer_id=obj.get("producer_id"),
            created_at=float(obj.get("created_at") or 0.0),
            batch=str(obj.get("batch", "")),
            incarnation=obj.get("inc"),
            txn=str(obj["txn"]) if obj.get("txn") is not None else None,
            chunk=int(obj["chunk"]) if obj.get("chunk") is not None else None,
            codec=str(obj["codec"]) if obj.get("codec") is not None else None,
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise StorageError(f"corrupt segment header: {exc}") from None


def taken_header(data: bytes, topic: str, partition: int, seq: int, base: int) -> SegmentHeader:
    """The header of the object at a taken number, or — when it cannot be decoded (e.g. the 0-byte
    object some stores keep when a writer dies between ``100 Continue`` and its body) — a stand-in
    holding no messages at offset ``base``. Every reader decides the same way (invariant I8: one
    bad object never stalls a partition, a producer, GC or the statistics)."""
    try:
        return decode_header(data)
    except StorageError:
        return SegmentHeader(topic, partition, seq, 0, base, None, 0.0, "")


def decode_segment(data: bytes) -> Segment:
    header = decode_header(data)
    lines = segment_lines(data, header)
    records = [Record.from_json(json.loads(line)) for line in lines]
    if len(records) != header.count:
        raise StorageError(
            f"corrupt segment {header.topic}/p{header.partition}/{header.seq}: "
            f"header says {header.count} messages, found {len(records)}"
        )
    return Segment(header, records)
