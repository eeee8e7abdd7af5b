"""I12: retention that cannot be held hostage (docs/operations.md, "Retention"): a subscription inactive
past the topic's ``subscription_timeout_seconds`` and segments past ``max_retention_seconds`` no
longer keep the topic's data; the subscriptions GC passed skip what was collected, counted.

GC frees in two phases (invariant I1): a "later collection" is a second call with a zero grace,
made more than a store-clock second after the first (whole-second Last-Modified). Ages are on the
store's clock (I15): "an hour later" moves the store's clock (``TimeTravelStore``).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from bucketq.core.membership import Membership
from bucketq.core.models import TopicConfig
from bucketq.core.subscriptions import init_subscription
from tests.support.engine_helpers import Backend, drain

HOUR = 3600.0


async def _six_segments(bq, **config: float) -> None:  # type: ignore[no-untyped-def]
    await bq.create_topic("t", config=TopicConfig(retention_seconds=60, **config))
    p = await bq.register_producer("p")
    for i in range(6):
        await p.publish("t", i)  # six one-message segments
    await p.close()


async def _collect_twice(bq):  # type: ignore[no-untyped-def]
    first = await bq.collect_garbage(member_ttl_s=10 * HOUR)
    await asyncio.sleep(2.1)
    second = await bq.collect_garbage(member_ttl_s=10 * HOUR, segment_grace_s=0)
    return first, second


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_an_abandoned_subscription_stops_holding_data_and_skips_what_was_collected(
    gc_backend: Backend,
) -> None:
    store = gc_backend.time_travel()
    bq = await gc_backend.connect(consumer={"checkpoint_every": 1000})
    await _six_segments(bq, subscription_timeout_seconds=600)
    lost = await bq.register_consumer("lost", "t", max_in_flight=1)
    await drain(lost, 2)
    await lost.close()  # leaves the group: no member heartbeats any more
    done = await bq.register_consumer("done", "t")
    await drain(done, 6)
    await done.close()
    await asyncio.sleep(0.3)

    store.advance(30)
    held = await bq.collect_garbage(member_ttl_s=10 * HOUR)
    assert held.abandoned_subscriptions == [] and held.fences_raised == 0  # not inactive yet

    store.advance(HOUR)
    fenced, freed = await _collect_twice(bq)
    assert sorted(fenced.abandoned_subscriptions) == ["t/done", "t/lost"]  # both inactive an hour
    assert fenced.fences_raised == 1 and fenced.expired_unconsumed == 4  # what "lost" had not read
    assert freed.segments == 6

    p = await bq.register_producer("p2")
    await p.publish("t", "after")
    back = await bq.register_consumer("lost", "t")
    got = await drain(back, 1)
    assert len(got) == 1  # only the message still stored: the 4 collected ones are skipped
    await back.close()
    [stats] = await bq.stats("t", "lost")
    assert stats.collected == 4, "what GC passed is counted, never lost silently"
    assert stats.acked == 3


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_a_live_idle_subscription_is_never_passed(gc_backend: Backend) -> None:
    bq = await gc_backend.connect(consumer={"heartbeat_interval_s": 0.5})
    await _six_segments(bq, subscription_timeout_seconds=1)
    idle = await bq.register_consumer("idle", "t", max_in_flight=1)
    await drain(idle, 1)
    await asyncio.sleep(2.5)  # no cursor write for longer than the timeout, but it heartbeats
    report = await bq.collect_garbage(member_ttl_s=10 * HOUR)
    assert report.abandoned_subscriptions == []
    ahead = await bq.collect_garbage(now=time.time() + HOUR, member_ttl_s=10 * HOUR)
    assert ahead.abandoned_subscriptions == [] and ahead.clock_warning, "r10: GC's host clock decides nothing"
    await idle.close()


async def test_a_quiet_member_is_live_for_the_ttl_it_announced(gc_backend: Backend) -> None:
    """An idle member heartbeats every ``heartbeat_idle_s`` (30 s) and announces a TTL of three
    times that: a topic whose subscription timeout is shorter must not pass its live group."""
    store = gc_backend.time_travel()
    bq = await gc_backend.connect()
    await _six_segments(bq, subscription_timeout_seconds=20)
    quiet = Membership(bq.storage, bq.keys, "t", "quiet", "quiet-member", ttl_s=20)
    await init_subscription(bq.storage, bq.keys, "t", "quiet")
    await quiet.heartbeat(ttl_s=90)  # what an idle member writes
    store.advance(60)
    within = await bq.collect_garbage(member_ttl_s=10 * HOUR)
    assert within.abandoned_subscriptions == [], "a heartbeat 60 s old, announcing 90 s, is live"
    store.advance(60)
    past = await bq.collect_garbage(member_ttl_s=10 * HOUR)
    assert past.abandoned_subscriptions == ["t/quiet"], "past its announced TTL the member is gone"


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_max_retention_frees_what_nobody_consumed(gc_backend: Backend) -> None:
    store = gc_backend.time_travel()
    bq = await gc_backend.connect(consumer={"checkpoint_every": 1000})
    await _six_segments(bq, max_retention_seconds=120)
    slow = await bq.register_consumer("slow", "t", max_in_flight=1)
    await drain(slow, 1)
    await slow.close()
    await asyncio.sleep(0.3)
    store.advance(90)
    kept = await bq.collect_garbage(member_ttl_s=10 * HOUR)
    assert kept.expired_unconsumed == 0 and kept.stored["t"].held_for_lagging == 5  # only the read one goes
    store.advance(HOUR)
    fenced, freed = await _collect_twice(bq)
    # the read segment's fence went up an hour earlier (the store's clock): it is freed at once
    assert fenced.expired_unconsumed == 5 and (fenced.segments, freed.segments) == (1, 5)
    assert freed.stored["t"].segments == 0
    again = await bq.register_consumer("slow", "t")
    assert await again.poll(max_messages=10, wait=1.0) == []
    await again.close()
    [stats] = await bq.stats("t", "slow")
    assert stats.collected == 5 and stats.backlog == 0


def test_limits_are_validated_and_absent_when_unset() -> None:
    assert "max_retention_seconds" not in TopicConfig().model_dump_json()
    with pytest.raises(ValueError, match="at least retention_seconds"):
        TopicConfig(retention_seconds=600, max_retention_seconds=60)
    with pytest.raises(ValueError):
        TopicConfig(subscription_timeout_seconds=0)
