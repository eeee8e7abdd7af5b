"""A member's join: what it reads, and when it has looked at its partitions."""

from __future__ import annotations

import asyncio

from bucketq import Bucketq, Settings
from bucketq.bench.metered import MeteredStore
from bucketq.core.cursor_log import CursorLog
from bucketq.storage import Blob, MemoryStore
from tests.support.virtual_tests import on_virtual_clock

SLOW_SEGMENT_GET_S = 0.4


class SlowSegments(MemoryStore):
    """The in-memory store whose segment GETs take as long as a large object on a busy S3."""

    async def get(self, key: str) -> Blob | None:
        if "/seg/" in key:
            await asyncio.sleep(SLOW_SEGMENT_GET_S)
        return await super().get(key)


def _bq(store: MemoryStore | MeteredStore) -> Bucketq:
    return Bucketq(Settings.from_dict({"backend": "memory", "strategy": "conditional_write"}), store=store)


def _delta_gets(store: MeteredStore) -> int:
    return sum(n for call, n in store.calls.items() if call.startswith("GET delta"))


async def test_a_join_reads_each_cursor_log_once() -> None:
    """The join loads every partition's cursor first (I5) and then starts each: the start only
    catches up (one 404 past the tip), it does not read the whole log a second time."""
    store = MeteredStore(MemoryStore())
    async with _bq(store) as bq:
        await bq.create_topic("t", partitions=4)
        producer = await bq.register_producer("p")
        await asyncio.gather(*(producer.publish("t", i) for i in range(200)))
        first = await bq.register_consumer("c", "t", max_in_flight=10)
        for _ in range(10):  # ten rounds of claims and acks: a few deltas on every partition
            for m in await first.poll(10, 2.0):
                await m.ack()
        await first.close()
        before = _delta_gets(store)
        for p in range(4):  # what loading the four logs costs, read by hand
            await CursorLog(bq.storage, bq.keys, "t", "c", p, member="reference").load()
        one_load = _delta_gets(store) - before
        assert one_load >= 4 + 4, "a few deltas on every partition, each log ending in a 404"
        before = _delta_gets(store)
        second = await bq.register_consumer("c", "t")
        joined = _delta_gets(store) - before
        await second.close()
    # one load, then per partition the start's 404 past the tip
    assert joined == one_load + 4, (joined, one_load)


@on_virtual_clock
async def test_first_look_waits_for_the_members_first_cycle() -> None:
    store = SlowSegments()
    async with _bq(store) as bq:
        await bq.create_topic("t")
        producer = await bq.register_producer("p")
        await asyncio.gather(*(producer.publish("t", i) for i in range(3)))
        member = await bq.register_consumer("c", "t")
        # the first look needs a slow segment read: a short poll ends before it does
        assert await member.poll(3, 0.05) == []
        assert await member.first_look(10.0) is True
        got = await member.poll(3, 0.0)
        assert sorted(m.payload for m in got) == [0, 1, 2]
        for m in got:
            await m.ack()
        assert await member.first_look(0.0) is True  # once looked, it stays so
