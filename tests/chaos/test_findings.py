"""What the chaos runs found, reduced to deterministic reproductions (regression tests).

On SeaweedFS, a process killed (or stopped) while its put-if-absent PUT is between the server's
``100 Continue`` and the body leaves a **0-byte object** at the key (botocore sends
``Expect: 100-continue``): the number is taken by something that is not a segment or a delta.
Invariant I8: no bad object ends a loop — an undecodable delta counts as an empty delta, an
undecodable segment takes its number with no messages, for consumers, producers, GC and the
statistics alike. Each test puts the 0-byte object the chaos run left, on the in-memory store, and
expects the engine to carry on.
"""

from __future__ import annotations

import asyncio

import pytest

from bucketq import Bucketq, Settings
from bucketq.core.cursor_log import CursorLog
from bucketq.core.keys import Keys
from bucketq.errors import BucketqError

FAST = {"poll_min_ms": 5, "poll_max_ms": 20}


def _settings() -> Settings:
    return Settings.from_dict(
        {"backend": "memory", "strategy": "conditional_write", "producer": {"linger_ms": 2}, "consumer": FAST}
    )


async def test_an_empty_delta_does_not_end_the_consumer_loop() -> None:
    async with Bucketq(_settings()) as bq:
        await bq.create_topic("t")
        producer = await bq.register_producer("p")
        consumer = await bq.register_consumer("g", "t")
        await producer.publish("t", "before")
        got = await consumer.poll(1, 5.0)
        await got[0].ack()
        # the next delta number is taken by what a killed writer's interrupted PUT left
        state = await CursorLog(bq.storage, Keys(""), "t", "g", 0, member="probe").load()
        await bq.storage.create(Keys("").delta("t", "g", 0, state.n + 1), b"")
        await producer.publish("t", "after")
        seen: list[str] = []
        for _ in range(30):
            try:
                msgs = await consumer.poll(1, 0.2)
            except BucketqError as exc:
                pytest.fail(f"the consumer died: {exc}")
            seen += [m.payload for m in msgs]
            await asyncio.gather(*(m.ack() for m in msgs))
            if seen:
                break
        assert seen == ["after"]


async def test_an_empty_segment_at_the_tail_does_not_stop_publishing() -> None:
    async with Bucketq(_settings()) as bq:
        await bq.create_topic("t")
        first = await bq.register_producer("p1")
        r = await first.publish("t", "before")
        await bq.storage.create(Keys("").segment("t", 0, r.seq + 1), b"")  # a killed producer's PUT
        fresh = await bq.register_producer("p2")  # finds the tail by probing past the empty one
        results = []
        for n in range(3):
            results.append(await fresh.publish("t", f"after-{n}"))
        assert all(res.seq > r.seq + 1 for res in results)
        await bq.stats("t")  # the statistics read the same headers: they must not raise either


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_an_empty_segment_does_not_stop_gc() -> None:
    async with Bucketq(_settings()) as bq:
        await bq.create_topic("t", retention_seconds=0.01)
        producer = await bq.register_producer("p")
        consumer = await bq.register_consumer("g", "t")
        r = await producer.publish("t", "before")
        for m in await consumer.poll(1, 5.0):
            await m.ack()
        await bq.storage.create(Keys("").segment("t", 0, r.seq + 1), b"")  # a killed producer's PUT
        state = await CursorLog(bq.storage, Keys(""), "t", "g", 0, member="probe").load()
        for _ in range(100):  # the consumer passes it as a corrupt (empty) segment: the floor moves on
            if state.floor > r.seq + 1:
                break
            await consumer.poll(1, 0.05)
            state = await CursorLog(bq.storage, Keys(""), "t", "g", 0, member="probe").load()
        assert state.floor > r.seq + 1 and state.counters.corrupt == 1
        freed = 0
        for pause in (0.05, 2.1):  # phase 1 raises the fence, phase 2 frees below it (a store second later)
            await asyncio.sleep(pause)
            freed += (await bq.collect_garbage(segment_grace_s=0.0, delta_grace_s=0.0)).segments
        assert freed == 2
