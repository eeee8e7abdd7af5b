"""Appending one segment at a partition's tail (put-if-absent), shared by producers and bulk writers."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from bucketq.core.keys import Keys
from bucketq.core.segment import SegmentHeader, decode_header, encode_segment
from bucketq.core.topics import find_tail
from bucketq.errors import AlreadyExists, Contended, PublishTimeout, StorageError
from bucketq.storage import Storage


@dataclass(frozen=True, slots=True)
class Appended:
    """Where a segment landed."""

    seq: int
    base: int
    count: int
    size: int


def head_hint(seq: int, next_offset: int) -> bytes:
    """The body of the advisory ``head.json``."""
    return json.dumps({"seq": seq, "next_offset": next_offset, "at": time.time()}).encode()


class SegmentWriter:
    """Writes pre-encoded message lines as the next segment of one partition.

    PUT ``seg/{next}`` with If-None-Match: on 412 the writer reads the segment there: its own batch id
    means a retried write had landed (done); another writer's means move past it. Contended claims
    (csprng_verify) and storage errors are retried with jittered backoff until ``timeout_s``.
    """

    def __init__(
        self,
        storage: Storage,
        keys: Keys,
        topic: str,
        partition: int,
        producer_id: str | None,
        *,
        timeout_s: float = 60.0,
        max_attempts: int = 50,
        on_conflict: Callable[[], None] | None = None,
    ) -> None:
        self.storage = storage
        self.keys = keys
        self.topic = topic
        self.partition = partition
        self.producer_id = producer_id
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.on_conflict = on_conflict
        self.next_seq: int | None = None
        self.next_offset = 0
        self.conflicts = 0

    async def append(self, lines: list[bytes], batch_id: str) -> Appended:
        """Write ``lines`` as one segment at the tail; returns where it landed."""
        if self.next_seq is None:
            self.next_seq, self.next_offset = await find_tail(self.storage, self.keys, self.topic, self.partition)
        deadline = time.monotonic() + self.timeout_s
        attempt = 0
        while True:
            attempt += 1
            seq, base = self.next_seq, self.next_offset
            header = SegmentHeader(
                self.topic, self.partition, seq, len(lines), base, self.producer_id, time.time(), batch_id
            )
            body = encode_segment(header, lines)
            key = self.keys.segment(self.topic, self.partition, seq)
            try:
                await self.storage.create(key, body)
            except AlreadyExists:
                blob = await self.storage.get(key)
                if blob is not None and decode_header(blob.data).batch == batch_id:
                    break  # our own write landed; its response was lost
                self.conflicts += 1
                if self.on_conflict is not None:
                    self.on_conflict()
                if blob is not None:
                    there = decode_header(blob.data)
                    self.next_seq, self.next_offset = seq + 1, there.base + there.count
                continue
            except Contended:
                await asyncio.sleep(random.uniform(0.05, 0.3))
            except StorageError as exc:
                if time.monotonic() >= deadline:
                    raise PublishTimeout(
                        f"publish to {self.topic}/p{self.partition} not durable after {self.timeout_s:.0f}s: {exc}"
                    ) from exc
                await asyncio.sleep(min(2.0, 0.05 * 2 ** min(attempt, 6)) * random.uniform(0.5, 1.0))
                continue
            else:
                break
            if attempt >= self.max_attempts or time.monotonic() >= deadline:
                raise PublishTimeout(f"publish to {self.topic}/p{self.partition}: too many conflicts")
        self.next_seq, self.next_offset = seq + 1, base + len(lines)
        return Appended(seq, base, len(lines), len(body))

    async def write_head(self) -> None:
        """Overwrite the advisory head hint with this writer's view of the tail (errors ignored)."""
        if self.next_seq is None or self.next_seq == 0:
            return
        try:
            await self.storage.overwrite(
                self.keys.head(self.topic, self.partition), head_hint(self.next_seq - 1, self.next_offset)
            )
        except StorageError:
            pass  # advisory only
