"""Ages that decide deletions, abandonments and takeovers are measured on the store's clock (I15).

An age measured as a host's ``time.time()`` minus a store's Last-Modified is off by that host's
clock error: a GC host ten minutes ahead passed a live subscription as abandoned and freed what
it had not read (reproduction r10); a producer whose clock was ahead took over another producer's
live dedup marker. Now such an age is the store's ``now()`` (a port operation every adapter
implements) minus the Last-Modified, and a host clock beyond the margin is reported.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import pytest

from bucketq.core import store_clock
from bucketq.core.keys import Keys
from bucketq.core.models import TopicConfig
from bucketq.core.store_clock import StoreClock
from bucketq.errors import NotSupported
from bucketq.storage import MemoryStore, Storage
from tests.support.engine_helpers import Backend, _backend_for, drain
from tests.support.virtual_tests import on_virtual_clock

SKEW_S = 600.0  # the GC host's clock runs ten minutes ahead


async def test_every_store_tells_the_time_its_objects_are_stamped_with(backend: Backend) -> None:
    """The port's ``now()``: the Last-Modified an object written at that moment gets (to the
    store's whole-second resolution), on every adapter."""
    bq = await backend.connect()
    before = await bq.storage.now()
    await bq.storage.overwrite("clock-probe", b"x")
    info = await bq.storage.head("clock-probe")
    after = await bq.storage.now()
    assert info is not None
    assert before - 1.0 <= info.last_modified <= after + 1.0
    assert after >= before
    assert bq.clock.readings == 1 and bq.clock.offset_s is not None  # compared once at open


async def test_a_host_clock_beyond_the_margin_is_reported(
    gc_backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    bq = await gc_backend.connect()
    count = store_clock.clock_warnings()
    near = StoreClock(bq.storage, host_clock=lambda: time.time() + 0.5, margin_s=2.0)
    await near.read()
    assert near.warnings == 0 and store_clock.clock_warnings() == count
    with caplog.at_level(logging.WARNING, logger="bucketq.clock"):
        far = StoreClock(bq.storage, host_clock=lambda: time.time() - 30, margin_s=2.0, who="probe")
        await far.read()
    assert far.warnings == 1 and store_clock.clock_warnings() == count + 1
    assert far.offset_s is not None and -32 < far.offset_s < -28
    assert any(
        "probe: the host clock is" in r.getMessage() and "behind" in r.getMessage() for r in caplog.records
    )


@pytest.mark.slow  # waits on wall-clock time (the segment grace): not in make test-fast
async def test_gc_with_a_clock_far_ahead_passes_no_live_group_and_frees_nothing_unread(
    gc_backend: Backend,
) -> None:
    """r10: a live, busy member (paused app, heartbeats landing); GC's host clock ten minutes
    ahead, the topic's subscription timeout five. Nothing is passed, nothing unread is freed,
    and the report says the clock is off."""
    bq = await gc_backend.connect(consumer={"heartbeat_interval_s": 0.5, "member_ttl_s": 5})
    config = TopicConfig(partitions=1, retention_seconds=60, subscription_timeout_seconds=300)
    await bq.create_topic("orders", config=config)
    member = await bq.register_consumer("billing", "orders", start_position="earliest")
    member.pause()  # the app is busy: the member stays live and heartbeats
    producer = await bq.register_producer("p")
    for i in range(30):
        await producer.publish("orders", i)
    await asyncio.sleep(1.0)
    first = await bq.collect_garbage(["orders"], now=time.time() + SKEW_S, segment_grace_s=1.0)
    await asyncio.sleep(2.5)  # past the grace on the store's clock
    second = await bq.collect_garbage(["orders"], now=time.time() + SKEW_S, segment_grace_s=1.0)
    assert first.abandoned_subscriptions == [] and second.abandoned_subscriptions == []
    assert first.fences_raised == 0 and second.segments == 0 and second.expired_unconsumed == 0
    assert first.clock_warning and first.clock_offset_s is not None and first.clock_offset_s > SKEW_S - 5
    member.resume()
    assert len(await drain(member, 30)) == 30


@on_virtual_clock
async def test_a_dedup_marker_young_on_the_stores_clock_is_not_taken_over() -> None:
    """A pending dedup marker written a moment ago by a producer whose clock runs an hour behind
    (its ``at`` an hour old) is another publish in flight: it is not taken over (a second copy
    would be stored when that publish lands). Once it is old on the store's clock, it is.
    On the in-memory store and the virtual clock: the producer's waits for the publish in flight
    are logic, and take no real time (the moto case below runs the same on the real clock)."""
    b = Backend("memory", {"backend": "memory", "strategy": "conditional_write"}, MemoryStore())
    try:
        await _a_young_marker_is_not_taken_over(b)
    finally:
        await b.close_all()


@pytest.mark.s3
async def test_a_dedup_marker_young_on_the_stores_clock_is_not_taken_over_on_moto(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    b = _backend_for("moto", request, tmp_path)
    try:
        await _a_young_marker_is_not_taken_over(b)
    finally:
        await b.close_all()


async def _a_young_marker_is_not_taken_over(gc_backend: Backend) -> None:
    store = gc_backend.time_travel()
    bq = await gc_backend.connect(producer={"publish_timeout_s": 5.0})
    await bq.create_topic("t")
    marker = {"state": "pending", "id": "x", "at": time.time() - 3600, "partition": 0, "from_seq": 0}
    key = bq.keys.dedup("t", "order-1")
    await bq.storage.create(key, json.dumps(marker).encode())
    p = await bq.register_producer("p")
    with pytest.raises(TimeoutError):  # it waits for the publish in flight (up to its timeout)
        await asyncio.wait_for(p.publish("t", "second", dedup_id="order-1"), 1.0)
    assert json.loads((await bq.storage.get(key)).data)["id"] == "x", "not taken over"  # type: ignore[union-attr]
    store.advance(10.0)  # now it is older than the publish timeout on the store's clock
    result = await p.publish("t", "second", dedup_id="order-1")
    assert not result.duplicate and json.loads((await bq.storage.get(key)).data)["state"] == "committed"  # type: ignore[union-attr]


async def test_a_store_without_a_clock_answer_is_read_through_a_written_object() -> None:
    """A store whose answers carry no time (``NotSupported``): the Last-Modified of a probe."""

    class NoDate(MemoryStore):
        async def now(self) -> float:
            raise NotSupported("no Date header")

    storage, keys = Storage(NoDate()), Keys("r")
    reading = await StoreClock(storage, keys=keys).read()
    assert abs(reading - time.time()) < 2.0
    assert await storage.head(keys.probe("clock")) is not None
    with pytest.raises(NotSupported):
        await StoreClock(storage).read()  # without keys to write a probe under
