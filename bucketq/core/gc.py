"""Retention and garbage collection (DESIGN.md 2.5). Never on the hot path: the operator runs it.

Deletes, in DeleteObjects batches: segments below every subscription's floor *and* past the
topic's retention; cursor deltas and checkpoints older than the second-newest checkpoint (and
older than ``GC_DELTA_GRACE_S``, see cursor_log); stale member heartbeats; expired dedup markers;
leftover probe and csprng claim objects.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from bucketq.core.cursor_log import GC_DELTA_GRACE_S, CursorLog
from bucketq.core.keys import Keys, parse_seq
from bucketq.core.topics import TopicCatalog
from bucketq.errors import TopicNotFound
from bucketq.storage import CLAIM_SUFFIX, Storage


@dataclass(slots=True)
class GcReport:
    """What one collection deleted, by kind."""

    segments: int = 0
    deltas: int = 0
    checkpoints: int = 0
    members: int = 0
    dedup_markers: int = 0
    probes: int = 0
    claims: int = 0
    kept_segments_unconsumed: int = 0
    deleted_keys: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.segments + self.deltas + self.checkpoints + self.members + self.dedup_markers + \
            self.probes + self.claims


class _Deleter:
    def __init__(self, storage: Storage, report: GcReport) -> None:
        self.storage = storage
        self.report = report
        self.pending: list[str] = []

    async def add(self, key: str) -> None:
        self.pending.append(key)
        self.report.deleted_keys.append(key)
        if len(self.pending) >= 1000:
            await self.flush()

    async def flush(self) -> None:
        if self.pending:
            await self.storage.delete(self.pending)
            self.pending = []


async def collect_garbage(
    storage: Storage,
    keys: Keys,
    *,
    topics: list[str] | None = None,
    member_ttl_s: float = 300.0,
    dedup_window_s: float = 3600.0,
    claim_timeout_s: float = 30.0,
    delta_grace_s: float = GC_DELTA_GRACE_S,
    now: float | None = None,
) -> GcReport:
    """Collect garbage for ``topics`` (default: every topic) plus the bucket-wide leftovers."""
    now = time.time() if now is None else now
    report = GcReport()
    deleter = _Deleter(storage, report)
    catalog = TopicCatalog(storage, keys)
    for topic in topics if topics is not None else await catalog.names():
        try:
            config = await catalog.config(topic)
        except TopicNotFound:
            continue
        consumers = await catalog.consumers(topic)
        for partition in range(config.partitions):
            floors = []
            for consumer in consumers:
                cursor = CursorLog(storage, keys, topic, consumer, partition, member="gc")
                state = await cursor.load()
                if state.started:
                    floors.append(state.floor)
                await _collect_log(storage, keys, topic, consumer, partition, now, delta_grace_s, deleter)
            min_floor = min(floors) if floors else None
            async for info in storage.list(keys.segments_prefix(topic, partition)):
                seq = parse_seq(info.key)
                expired = now - info.last_modified > config.retention_seconds
                if not expired:
                    break  # segments are written in order: the rest are younger
                if min_floor is not None and seq >= min_floor:
                    report.kept_segments_unconsumed += 1
                    continue
                await deleter.add(info.key)
                report.segments += 1
        async for info in storage.list(keys.dedup_prefix(topic)):
            if now - info.last_modified > dedup_window_s:
                await deleter.add(info.key)
                report.dedup_markers += 1
        async for info in storage.list(keys.members_topic_prefix(topic)):
            if now - info.last_modified > member_ttl_s:
                await deleter.add(info.key)
                report.members += 1
    async for info in storage.list(keys.probes_prefix()):
        if now - info.last_modified > 3600:
            await deleter.add(info.key)
            report.probes += 1
    await deleter.flush()
    await _collect_claims(storage, keys, now, claim_timeout_s, deleter, topics)
    await deleter.flush()
    return report


async def _collect_log(
    storage: Storage, keys: Keys, topic: str, consumer: str, partition: int,
    now: float, grace_s: float, deleter: _Deleter,
) -> None:
    ckpts = [parse_seq(i.key) async for i in storage.list(keys.checkpoints_prefix(topic, consumer, partition))]
    if len(ckpts) < 2:
        return
    keep_from = sorted(ckpts)[-2]
    for n in ckpts:
        if n < keep_from:
            await deleter.add(keys.checkpoint(topic, consumer, partition, n))
            deleter.report.checkpoints += 1
    async for info in storage.list(keys.deltas_prefix(topic, consumer, partition)):
        n = parse_seq(info.key)
        if n > keep_from:
            break
        if now - info.last_modified > grace_s:
            await deleter.add(info.key)
            deleter.report.deltas += 1


async def _collect_claims(
    storage: Storage, keys: Keys, now: float, claim_timeout_s: float, deleter: _Deleter,
    topics: list[str] | None,
) -> None:
    """csprng_verify claims left behind by crashed writers (only where that strategy is used)."""
    if storage.strategy != "csprng_verify":
        return
    prefixes = [keys.topic_prefix(t) for t in topics] if topics is not None else [keys.prefix]
    for prefix in prefixes:
        async for info in storage.list(prefix):
            if info.key.endswith(CLAIM_SUFFIX) and now - info.last_modified > 10 * claim_timeout_s:
                await deleter.add(info.key)
                deleter.report.claims += 1
