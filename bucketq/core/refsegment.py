"""Reference segments (format 5): a segment whose lines name the columnar chunks holding its messages.

A job commit appends, per partition, a small segment at the tail like any other (put-if-absent,
contiguous seqs and offsets), whose header says ``"codec": "ref"`` (and ``"v": 2``) and whose lines
are :class:`~bucketq.core.chunks.ChunkRef` objects, in message order::

    {"v":2,"topic":"orders","partition":0,"seq":41,...,"count":250000,"base":98000,"txn":"nightly.000001","chunk":0,"codec":"ref"}
    {"name":"nightly/<run>/t00000-a0/p0000-000000.arrow","etag":"…","count":100000,"bytes":1203311,"min_us":…,"max_us":…}
    …

Message ``i`` of the segment is row ``i - (rows of the chunks before it)`` of its chunk, so
positions (seq, index) and offsets (``base + index``) mean what they mean for any segment. The
chunks are written before the segment and never change (readers check their ETags); GC deletes a
segment's chunks with it (core/txn.py ``collect_transactions``).

:func:`load_segment` reads any segment the way a consumer needs it: message lines decoded, a
reference segment's chunks fetched and turned into records.
"""

from __future__ import annotations

import asyncio
import json
import logging

from bucketq.core.chunks import ChunkRef, CorruptChunk, chunk_records, decode_chunk, same_etag
from bucketq.core.keys import Keys
from bucketq.core.segment import (
    REF_CODEC,
    Segment,
    SegmentHeader,
    decode_header,
    decode_segment,
    encode_header,
)
from bucketq.errors import StorageError
from bucketq.storage import Storage

log = logging.getLogger("bucketq.consumer")

FETCH_CONCURRENCY = 8


def encode_ref_segment(header: SegmentHeader, refs: list[ChunkRef]) -> bytes:
    """The bytes of a reference segment (``header.count`` must be the chunks' total)."""
    if header.codec != REF_CODEC:
        raise ValueError("a reference segment's header has codec 'ref'")
    if header.count != sum(r.count for r in refs):
        raise ValueError(f"header count {header.count} != chunks' {sum(r.count for r in refs)}")
    lines = [json.dumps(r.to_json(), separators=(",", ":")).encode() for r in refs]
    return b"\n".join([encode_header(header), *lines]) + b"\n"


def decode_refs(data: bytes, header: SegmentHeader | None = None) -> list[ChunkRef]:
    """The chunks a reference segment names, in message order (checked against its count)."""
    header = header or decode_header(data)
    body = data.split(b"\n", 1)[1] if b"\n" in data else b""
    try:
        refs = [ChunkRef.from_json(json.loads(line)) for line in body.split(b"\n") if line.strip()]
    except ValueError as exc:
        raise CorruptChunk(f"reference segment {_where(header)} is not readable: {exc}") from None
    if sum(r.count for r in refs) != header.count:
        raise CorruptChunk(
            f"reference segment {_where(header)}: header says {header.count} messages, "
            f"its chunks hold {sum(r.count for r in refs)}"
        )
    return refs


def _where(header: SegmentHeader) -> str:
    return f"{header.topic}/p{header.partition}/{header.seq}"


async def fetch_chunk(storage: Storage, keys: Keys, topic: str, ref: ChunkRef) -> bytes:
    """A chunk's bytes, checked against its reference (missing or changed: :class:`CorruptChunk`;
    a chunk is written once and never changes, I18)."""
    key = keys.chunk(topic, ref.name)
    blob = await storage.get(key)
    if blob is None:
        raise CorruptChunk(f"chunk {key} is missing")
    if not same_etag(blob.etag, ref.etag) or len(blob.data) != ref.bytes:
        raise CorruptChunk(f"chunk {key} is not the one its reference segment names (ETag or size differ)")
    return blob.data


async def load_segment(storage: Storage, keys: Keys, data: bytes) -> Segment:
    """The segment in ``data`` with its records; a reference segment's chunks are read for them.

    Raises :class:`~bucketq.errors.StorageError` (a corrupt segment or chunk:
    :class:`~bucketq.core.chunks.CorruptChunk`; the store failing) and
    :class:`~bucketq.core.segment.UnsupportedSegment` (a newer format: never skip it).
    """
    header = decode_header(data)
    if not header.is_reference:
        return decode_segment(data)
    refs = decode_refs(data, header)
    limit = asyncio.Semaphore(FETCH_CONCURRENCY)

    async def one(ref: ChunkRef) -> bytes:
        async with limit:
            return await fetch_chunk(storage, keys, header.topic, ref)

    blobs = await asyncio.gather(*(one(r) for r in refs))
    records = []
    for ref, blob in zip(refs, blobs, strict=True):
        chunk = decode_chunk(blob, what=f"chunk {ref.name}")
        if chunk.rows != ref.count:
            raise CorruptChunk(
                f"chunk {ref.name} holds {chunk.rows} messages, its reference says {ref.count}"
            )
        records.extend(chunk_records(chunk))
    return Segment(header, records)


async def created_at_of(storage: Storage, keys: Keys, data: bytes, indexes: set[int]) -> float | None:
    """``created_at`` of the first message of the segment in ``data`` whose index is not in
    ``indexes``, or None (all are, or it cannot be read). A reference segment's is read from the
    one chunk holding that message, its ``created_at`` column only: a partition's statistics
    never fetch a whole job. A missing chunk (an aborted job's, deleted) gives None."""
    header = decode_header(data)
    first = next((i for i in range(header.count) if i not in indexes), None)
    if first is None:
        return None
    if not header.is_reference:
        records = decode_segment(data).records
        return records[first].created_at if first < len(records) else None
    try:
        row = first
        for ref in decode_refs(data, header):
            if row < ref.count:
                blob = await fetch_chunk(storage, keys, header.topic, ref)
                chunk = decode_chunk(blob, ["created_at"], what=f"chunk {ref.name}")
                micros = chunk.table.column("created_at").cast("int64")[row].as_py()
                return None if micros is None else micros / 1_000_000
            row -= ref.count
    except CorruptChunk:
        return None
    return None


# -- what a consumer reads -------------------------------------------------------------------------


def header_or_stand_in(data: bytes, topic: str, partition: int, seq: int) -> SegmentHeader:
    """The segment's header, or the empty stand-in's when it cannot be decoded (see
    :func:`decode_or_stand_in`)."""
    try:
        return decode_header(data)
    except StorageError:
        return SegmentHeader(topic, partition, seq, 0, -1, None, 0.0, "")


async def load_or_stand_in(
    storage: Storage, keys: Keys, data: bytes, topic: str, partition: int, seq: int, hidden: bool = False
) -> Segment:
    """The segment with its records, as a consumer enters it: a reference segment's are read
    from its chunks (not when ``hidden``: its transaction does not show it, every message is
    skipped). Chunks that are missing or cannot be decoded make it an empty stand-in, like an
    undecodable segment (I8); a store failure is raised (the cycle is tried again), and so is a
    format this version cannot read (:class:`~bucketq.core.segment.UnsupportedSegment`)."""
    try:
        header: SegmentHeader | None = decode_header(data)
    except StorageError:
        header = None
    if header is None or not header.is_reference:
        segment = decode_or_stand_in(data, topic, partition, seq)
    elif hidden:
        return Segment(header, [], hidden=True)
    else:
        try:
            segment = await load_segment(storage, keys, data)
        except CorruptChunk as exc:
            log.error(
                "%s/p%d: segment %d cannot be read (%s); its messages are skipped", topic, partition, seq, exc
            )
            segment = Segment(header, [])
    return Segment(segment.header, segment.records, hidden=True) if hidden else segment


def decode_or_stand_in(data: bytes, topic: str, partition: int, seq: int) -> Segment:
    """The segment, or, when it cannot be decoded, an empty stand-in (logged) that lets the
    partition move on: one bad object must not stall every consumer of the partition."""
    try:
        return decode_segment(data)
    except (StorageError, ValueError, KeyError, TypeError) as exc:
        log.error(
            "%s/p%d: segment %d cannot be decoded (%s); its messages are skipped", topic, partition, seq, exc
        )
        return Segment(header_or_stand_in(data, topic, partition, seq), [])
