"""The producers and consumers of one run, each on its own connection, with their consume loops."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from bucketq import Bucketq, Consumer, Producer
from bucketq.bench.backends import Backend, RunBucket
from bucketq.bench.tracker import Tracker
from bucketq.bench.workers import ProgressFn, consume, wait_done

GROUP = "bench"


@dataclass
class Fleet:
    """One run's topic, its metered producer and consumer connections, and an unmetered admin one."""

    run: RunBucket
    topic: str
    admin: Bucketq
    group: str = GROUP
    producers: list[Producer] = field(default_factory=list)
    consumers: list[Consumer] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    loops: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def strategy(self) -> str:
        return self.admin.strategy

    async def add_producers(self, count: int) -> None:
        for i in range(count):
            bq = await self.run.connect()
            self.producers.append(await bq.register_producer(f"{self.topic}-producer-{i}"))

    async def add_consumers(self, count: int) -> None:
        """``count`` members of the consumer group, joining at the same time."""
        conns = [await self.run.connect() for _ in range(count)]
        joined = await asyncio.gather(*(bq.register_consumer(self.group, [self.topic]) for bq in conns))
        self.consumers.extend(joined)

    def start_consuming(self, tracker: Tracker, batch: int, on_ack: ProgressFn | None = None) -> None:
        self.loops = [
            asyncio.create_task(consume(c, tracker, self.stop, batch=batch, on_ack=on_ack))
            for c in self.consumers
        ]

    async def wait(self, tracker: Tracker, idle_timeout_s: float) -> tuple[bool, list[str]]:
        """Wait until every message is acked; (False, errors) on idle timeout or a failed consume loop."""
        waiter = asyncio.create_task(wait_done(tracker, idle_timeout_s))
        await asyncio.wait([waiter, *self.loops], return_when=asyncio.FIRST_COMPLETED)
        errors = [
            f"{type(exc).__name__}: {exc}"
            for t in self.loops
            if t.done() and not t.cancelled() and (exc := t.exception()) is not None
        ]
        if not waiter.done():
            waiter.cancel()
            return False, errors
        return waiter.result() and not errors, errors

    async def finish(self, grace_s: float) -> None:
        """Keep consuming ``grace_s`` longer (late duplicates show up), then stop the loops."""
        if self.loops:
            await asyncio.sleep(grace_s)
        self.stop.set()
        await asyncio.gather(*self.loops, return_exceptions=True)

    def engine_counters(self) -> dict[str, int]:
        return {
            "commits": sum(c.counters.commits for c in self.consumers),
            "commit_conflicts": sum(c.counters.conflicts for c in self.consumers),
            "lease_lost": sum(c.counters.lease_lost for c in self.consumers),
        }


async def open_fleet(backend: Backend, topic: str, partitions: int, group: str = GROUP) -> Fleet:
    """A fresh bucket with ``topic`` created (by the unmetered admin connection)."""
    run = backend.fresh()
    admin = await run.connect(metered=False)
    try:
        await admin.create_topic(topic, partitions=partitions)
    except BaseException:
        await run.close()
        raise
    return Fleet(run, topic, admin, group)
