"""Helpers of the Spark tests: fast bulk publishing through the engine, reading topics back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from bucketq import Bucketq, PublishResult, Settings
from bucketq.core.keys import Keys
from bucketq.core.segment import Record, decode_segment
from bucketq.spark.planning import list_segments
from bucketq.storage import open_storage

BULK = {"linger_ms": 200, "max_batch_messages": 5000, "max_batch_bytes": 8 * 1024 * 1024}


async def publish_many(
    settings: Settings,
    topic: str,
    count: int,
    *,
    partitions: int = 1,
    make: Callable[[int], dict[str, Any]] | None = None,
    create: bool = True,
) -> list[PublishResult]:
    """Publish ``count`` messages with the engine's producer in big group commits."""
    make = make or (lambda i: {"payload": {"n": i}})
    async with Bucketq(settings) as bq:
        if create:
            await bq.create_topic(topic, partitions=partitions)
        producer = await bq.register_producer("bulk", **BULK)
        results: list[PublishResult] = []
        for start in range(0, count, 20_000):
            chunk = range(start, min(count, start + 20_000))
            results += await asyncio.gather(*(producer.publish(topic, **make(i)) for i in chunk))
        return results


async def topic_records(settings: Settings, topic: str) -> list[tuple[int, int, int, Record]]:
    """Every message of the topic as (partition, seq, index, record), read by the engine."""
    storage = await open_storage(settings)
    keys = Keys(settings.root)
    out = []
    try:
        async with Bucketq(settings) as bq:
            partitions = (await bq.catalog.config(topic)).partitions
        for p in range(partitions):
            for ref in await list_segments(storage, keys, topic, p, 0, None):
                blob = await storage.get(keys.segment(topic, p, ref.seq))
                assert blob is not None
                for i, r in enumerate(decode_segment(blob.data).records):
                    out.append((p, ref.seq, i, r))
    finally:
        await storage.close()
    return out


async def keys_under(settings: Settings, prefix: str) -> list[str]:
    storage = await open_storage(settings)
    try:
        return [info.key async for info in storage.store.list(prefix)]
    finally:
        await storage.close()
