"""Engine behaviours the sidecar's drain depends on, checked in-process with S3-like write latency."""

from __future__ import annotations

import asyncio

from bucketq import Bucketq, Settings
from bucketq.storage import MemoryStore

SLOW_PUT_S = 0.05  # an S3 PUT takes tens of ms; the in-memory store answers at once


class SlowPutStore(MemoryStore):
    """The in-memory store with S3-like write latency."""

    async def put(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        await asyncio.sleep(SLOW_PUT_S)
        return await super().put(key, data, if_none_match=if_none_match, if_match=if_match)


def _bq() -> Bucketq:
    return Bucketq(
        Settings.from_dict({"backend": "memory", "strategy": "conditional_write"}), store=SlowPutStore()
    )


async def test_close_releases_prefetched_messages_uncounted() -> None:
    async with _bq() as bq:
        await bq.create_topic("t")
        producer = await bq.register_producer("p")
        await asyncio.gather(*(producer.publish("t", {"i": i}) for i in range(20)))
        first = await bq.register_consumer("c", ["t"], max_in_flight=20)
        while first.in_flight < 20:  # prefetched, none delivered
            await asyncio.sleep(0.01)
        await first.close()
        stats = await bq.stats("t", "c")
        assert stats[0].in_flight == 0, f"{stats[0].in_flight} prefetched leases survived close(drain=True)"
