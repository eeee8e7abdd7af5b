"""The push lease keeper backs off while extends fail (issue 23), and keeps leases across a brownout.

The keeper retried a failed extend every 50 ms once a lease was inside its last third, for as long
as the extends failed, per open push. The engine's ``extend`` waits for its cursor write while the
bucket fails (the consumer loop retries the commit), so a brownout alone shows up as a slow
extend; an extend that fails fast (an error from a lower layer) made the keeper spin. Both are run
here against a real consumer on the in-memory store: once with the store failing every write, once
with extends that fail fast during the outage (the consumer behind a fault injector of its own).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bucketq import Bucketq
from bucketq.config import Settings
from bucketq.core.consumer import Consumer
from bucketq.core.message import Message
from bucketq.errors import StorageError
from bucketq.sidecar.push import KEEPER_RETRY_INITIAL_S, keep_leases, keeper_backoff
from bucketq.storage import MemoryStore
from bucketq.storage.faults import FaultyStore

VT = 6.0
MESSAGES = 4
SETTINGS = Settings.from_dict({"backend": "memory", "strategy": "conditional_write"})


def test_keeper_backoff_is_bounded_by_the_visibility_timeout() -> None:
    assert keeper_backoff(30.0).max_s == 5.0
    assert keeper_backoff(8.0).max_s == 2.0
    assert keeper_backoff(0.5).max_s == KEEPER_RETRY_INITIAL_S  # never below the first step
    schedule = keeper_backoff(60.0)
    delays = [schedule.delay(n) for n in range(1, 12)]
    assert all(0 < d <= 5.0 for d in delays) and delays[0] <= KEEPER_RETRY_INITIAL_S


async def _leased(bq: Bucketq) -> tuple[Consumer, list[Message]]:
    await bq.create_topic("t", partitions=1)
    for i in range(MESSAGES):
        await bq.publish("t", {"n": i})
    member = await bq.register_consumer("c", "t", visibility_timeout_s=VT, max_in_flight=MESSAGES)
    got: list[Message] = []
    deadline = time.monotonic() + 10
    while len(got) < MESSAGES and time.monotonic() < deadline:
        got += await member.poll(max_messages=MESSAGES - len(got), wait=0.2)
    assert len(got) == MESSAGES
    return member, got


class FailingExtends:
    """The real consumer, except that ``extend`` fails at once while ``failing`` (and is counted)."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.settings = consumer.settings
        self.failing = False
        self.failed_calls: list[float] = []

    async def extend(self, receipt: str, seconds: float) -> float:
        if self.failing:
            self.failed_calls.append(time.monotonic())
            raise StorageError("injected: the bucket is not answering")
        return await self.consumer.extend(receipt, seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.consumer, name)


async def test_keeper_backs_off_while_extends_fail_fast() -> None:
    async with Bucketq(SETTINGS) as bq:
        member, messages = await _leased(bq)
        first_deadline = min(m.lease_until for m in messages)
        faulty = FailingExtends(member)
        # failing from the first due extend (a third of the lease before it runs out, 2 s) until
        # 0.9 s before: the keeper's last chance (0.5 s before) comes after the outage
        faulty.failing = True
        keeper = asyncio.create_task(keep_leases(faulty, messages, keeper_backoff(VT)))  # type: ignore[arg-type]
        await asyncio.sleep(first_deadline - 0.9 - time.time())
        faulty.failing = False
        await asyncio.sleep(VT / 2)
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)
        rounds = len(faulty.failed_calls) // MESSAGES
        assert rounds >= 1, "the keeper never tried during the outage: the test tests nothing"
        # 1.1 s of failing extends: every 50 ms that was about 22 rounds; with the backoff (steps of
        # 0.125-0.25, 0.25-0.5, 0.5-1 s) at most five
        assert rounds <= 5, f"{rounds} rounds of failed extends in 1.1 s"
        assert all(m.lease_until > first_deadline for m in messages), "a lease was not kept"
        assert member.in_flight == MESSAGES, "a lease was lost"
        await member.close()


async def test_keeper_keeps_the_leases_across_a_store_brownout() -> None:
    store = FaultyStore(MemoryStore(), seed=3)
    async with Bucketq(SETTINGS, store=store) as bq:
        member, messages = await _leased(bq)
        first_deadline = min(m.lease_until for m in messages)
        brownout = store.add(op="PUT", kind="error", times=None)  # every write fails until 0.9 s before
        keeper = asyncio.create_task(keep_leases(member, messages, keeper_backoff(VT)))
        await asyncio.sleep(first_deadline - 0.9 - time.time())
        store.faults.remove(brownout)
        assert store.injected["error"] >= 1, "nothing was written during the brownout"
        await asyncio.sleep(VT / 2)
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)
        assert all(m.lease_until > first_deadline for m in messages), "a lease was not kept"
        assert member.in_flight == MESSAGES, "a lease was lost"
        await member.close()
