"""An idle queue is cheap and still picks up fast (invariant I13, core/wake.py).

While a member's topics are idle it polls one wake object per topic instead of every partition,
heartbeats rarely (announcing a longer TTL) and polls partitions only at a slow fallback. A
producer's first append after a quiet spell touches the wake object; a lost touch only delays
pickup to the fallback poll.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from bucketq.bench.metered import MeteredStore
from bucketq.core.membership import Membership
from bucketq.core.wake import WakeWatch, touch_wake
from bucketq.errors import StorageError
from bucketq.storage.memory import MemoryStore
from tests.support.engine_helpers import Backend

IDLE = {
    "idle_after_s": 0.3,
    "poll_max_ms": 20,
    "poll_idle_ms": 60_000,  # the fallback: far longer than any wait below
    "wake_poll_ms": 100,
    "heartbeat_interval_s": 0.5,
    "heartbeat_idle_s": 30,
    "member_ttl_s": 3,
}


class _RefusingWakes(MeteredStore):
    """A store where every write of a wake object fails (the fallback must carry pickup)."""

    async def put(self, key: str, data: bytes, **kw):  # type: ignore[no-untyped-def, override]
        if key.endswith("/.wake"):
            raise StorageError("wake writes refused")
        return await super().put(key, data, **kw)


def _kinds(store: MeteredStore) -> Counter[str]:
    out: Counter[str] = Counter()
    for call, n in store.calls.items():
        op, kind = call.split()[:2]
        out[f"{op} {kind}"] += n
    return out


async def _pickup(store: MeteredStore, **consumer: float) -> tuple[float, Counter[str]]:
    """Seconds from a publish after an idle spell to its delivery, and the idle spell's calls."""
    b = Backend("memory", {"backend": "memory", "strategy": "conditional_write"}, store)
    bq = await b.connect(consumer={**IDLE, **consumer})
    await bq.create_topic("t", partitions=4)
    producer = await bq.register_producer("p")
    member = await bq.register_consumer("c", "t")
    try:
        await member.poll(1, 1.0)  # nothing yet
        await asyncio.sleep(1.0)  # idle now
        before = _kinds(store)
        await asyncio.sleep(2.0)
        idle_calls = _kinds(store) - before
        started = time.monotonic()
        await producer.publish("t", "after the silence")
        got = await member.poll(1, 10.0)
        took = time.monotonic() - started
        assert [m.payload for m in got] == ["after the silence"]
        await got[0].ack()
    finally:
        await b.close_all()
    return took, idle_calls


async def test_an_idle_member_polls_the_wake_object_not_the_partitions() -> None:
    store = MeteredStore(MemoryStore())
    took, idle = await _pickup(store)
    assert took < 2.0, f"pickup after silence took {took:.2f}s (the fallback is 60 s: the wake failed)"
    # two idle seconds: ~20 wake polls (100 ms), no partition polls (fallback 60 s), no heartbeat
    assert idle["GET wake"] >= 5, idle
    assert idle["GET segment"] == 0, idle
    assert idle["PUT member"] == 0 and idle["LIST member"] == 0, idle


async def test_a_lost_wake_touch_only_delays_pickup_to_the_fallback() -> None:
    store = _RefusingWakes(MemoryStore())
    took, _ = await _pickup(store, poll_idle_ms=1500)
    assert took < 6.0, f"pickup took {took:.2f}s with a 1.5 s fallback"


async def test_a_busy_producer_touches_the_wake_object_rarely() -> None:
    store = MeteredStore(MemoryStore())
    b = Backend("memory", {"backend": "memory", "strategy": "conditional_write"}, store)
    bq = await b.connect()
    await bq.create_topic("t", partitions=2)
    producer = await bq.register_producer("p")
    for i in range(50):
        await producer.publish("t", i)
    await b.close_all()
    assert _kinds(store)["PUT wake"] == 1  # once per WAKE_REFRESH_S per topic and producer


async def test_wake_watch_sees_changes() -> None:
    b = Backend("memory", {"backend": "memory", "strategy": "conditional_write"}, MemoryStore())
    bq = await b.connect()
    watch = WakeWatch(bq.storage, bq.keys, "t")
    assert not await watch.changed()  # nothing there yet
    assert await touch_wake(bq.storage, bq.keys, "t", "me")
    assert await watch.changed()
    assert not await watch.changed()
    await asyncio.sleep(0.01)
    await touch_wake(bq.storage, bq.keys, "t", "me")
    assert await watch.changed()
    await b.close_all()


async def test_a_quiet_member_stays_live_for_the_ttl_it_announced() -> None:
    """A member heartbeating rarely says how long it stays valid; readers with a shorter TTL of
    their own keep counting it, and stop once that announced TTL ran out."""
    b = Backend("memory", {"backend": "memory", "strategy": "conditional_write"}, MemoryStore())
    bq = await b.connect()
    quiet = Membership(bq.storage, bq.keys, "t", "g", "quiet", ttl_s=1.0)
    reader = Membership(bq.storage, bq.keys, "t", "g", "reader", ttl_s=1.0)
    await quiet.heartbeat(ttl_s=2.5)
    await asyncio.sleep(1.5)
    assert await reader.refresh() == ["quiet", "reader"]
    await asyncio.sleep(1.5)
    assert await reader.refresh() == ["reader"]
    await b.close_all()
