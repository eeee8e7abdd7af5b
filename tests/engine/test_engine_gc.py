"""Retention and garbage collection delete exactly what docs/protocol.md says, and nothing else.

GC frees in two phases (invariant I1): a collection raises a fence, and only a collection after the
fence is ``grace`` old on the store's clock deletes below it. Tests stand for "a later collection"
by passing a zero grace to the second call. Every age is on the store's clock (I15): "an hour
later" moves the store's clock (``TimeTravelStore``); a GC host's clock (``now=``) decides nothing.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from bucketq.core.cursor_log import CursorLog
from bucketq.core.keys import Keys, parse_seq
from tests.support.engine_helpers import Backend, drain

HOUR = 3600.0


async def all_keys(bq) -> set[str]:  # type: ignore[no-untyped-def]
    return {i.key async for i in bq.storage.list("")}


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_segments_deleted_only_below_every_floor_and_past_retention(gc_backend: Backend) -> None:
    store = gc_backend.time_travel()
    bq = await gc_backend.connect(consumer={"checkpoint_every": 1000})
    await bq.create_topic("t", retention_seconds=60)
    p = await bq.register_producer("p")
    for i in range(6):
        await p.publish("t", i)  # six one-message segments
    fast = await bq.register_consumer("fast", "t")
    await drain(fast, 6)
    slow = await bq.register_consumer("slow", "t", max_in_flight=1)
    await drain(slow, 2)
    await asyncio.sleep(0.3)  # let the last ack commit
    keys = Keys(bq.settings.root)
    assert (await bq.collect_garbage()).segments == 0  # nothing past retention yet
    ahead = await bq.collect_garbage(now=time.time() + HOUR, member_ttl_s=10 * HOUR)
    assert ahead.segments == ahead.fences_raised == 0 and ahead.clock_warning, (
        "GC's host clock decides nothing"
    )
    before = await all_keys(bq)
    store.advance(HOUR)  # an hour later, on the store's clock
    fenced = await bq.collect_garbage(member_ttl_s=10 * HOUR)
    assert fenced.fences_raised == 1 and fenced.segments == 0, "a fresh fence frees nothing yet"
    assert await bq.storage.head(keys.segment_floor("t", 0)) is not None
    # even a grace of 0 counts a fence one store-clock second younger (whole-second Last-Modified)
    await asyncio.sleep(2.1)
    report = await bq.collect_garbage(member_ttl_s=10 * HOUR, segment_grace_s=0)
    slow_floor = [await CursorLog(bq.storage, keys, "t", "slow", 0, "x").load()][0].floor
    assert slow_floor >= 2
    expected = {keys.segment("t", 0, s) for s in range(slow_floor)}
    gone = before - await all_keys(bq)
    assert {k for k in gone if "/seg/" in k} == expected
    assert report.segments == len(expected) and report.kept_segments_unconsumed == 6 - slow_floor
    assert not any("/log/" in k or "/.topic" in k or "head.json" in k or "floor.json" in k for k in gone)
    rest = await drain(slow, 6 - slow_floor)  # the slow consumer still gets the rest
    assert len(rest) >= 6 - slow_floor - 1


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_cursor_logs_are_compacted_behind_the_second_newest_checkpoint(gc_backend: Backend) -> None:
    bq = await gc_backend.connect(consumer={"checkpoint_every": 4})
    await bq.create_topic("t")
    p = await bq.register_producer("p")
    for i in range(20):
        await p.publish("t", i)
    c = await bq.register_consumer("c", "t", max_in_flight=1)
    await drain(c, 20)
    await c.close()
    await asyncio.sleep(0.2)
    keys = Keys(bq.settings.root)
    reference = (await CursorLog(bq.storage, keys, "t", "c", 0, "x").load()).to_json()
    young = await bq.collect_garbage()
    assert young.deltas == 0, "deltas are kept while the trim fence is younger than the grace"
    assert young.checkpoints >= 1, "checkpoints older than the second-newest go at once"
    late = await bq.collect_garbage(now=time.time() + HOUR)
    assert late.deltas == 0, "a host clock far ahead does not age a fence: the store's clock does"
    assert late.clock_warning and late.clock_offset_s is not None and late.clock_offset_s > HOUR - 5
    await asyncio.sleep(2.1)  # even a grace of 0 counts a fence one store-clock second younger
    report = await bq.collect_garbage(now=time.time() + HOUR, delta_grace_s=0)
    ckpts = sorted([parse_seq(i.key) async for i in bq.storage.list(keys.checkpoints_prefix("t", "c", 0))])
    deltas = sorted([parse_seq(i.key) async for i in bq.storage.list(keys.deltas_prefix("t", "c", 0))])
    assert len(ckpts) == 2 and report.deltas > 0
    assert deltas[0] == ckpts[0] + 1, "every delta after the second-newest checkpoint is kept"
    reloaded = (await CursorLog(bq.storage, keys, "t", "c", 0, "y").load()).to_json()
    assert reloaded == reference, "a reader after GC sees exactly the same state"


async def test_members_dedup_markers_and_probes(gc_backend: Backend) -> None:
    store = gc_backend.time_travel()
    bq = await gc_backend.connect()
    await bq.create_topic("t")
    p = await bq.register_producer("p")
    await p.publish("t", 1, dedup_id="once")
    c = await bq.register_consumer("c", "t")
    keys = Keys(bq.settings.root)
    await bq.storage.overwrite(keys.probe("leftover"), b"x")
    report_now = await bq.collect_garbage(member_ttl_s=60, dedup_window_s=60)
    assert (report_now.members, report_now.dedup_markers, report_now.probes) == (0, 0, 0)
    ahead = await bq.collect_garbage(now=time.time() + 2 * HOUR, member_ttl_s=60, dedup_window_s=60)
    assert (ahead.members, ahead.dedup_markers, ahead.probes) == (0, 0, 0), "the host clock decides nothing"
    await c.close()  # (a running member would heartbeat again after the jump below)
    await bq.storage.overwrite(keys.member("t", "c", "crashed"), b"{}")  # a crashed member's heartbeat
    store.advance(2 * HOUR)  # two hours later, on the store's clock
    report = await bq.collect_garbage(member_ttl_s=60, dedup_window_s=60)
    assert (report.members, report.dedup_markers, report.probes) == (1, 1, 1)
    assert await bq.storage.head(keys.member("t", "c", "crashed")) is None
    assert await bq.storage.head(keys.dedup("t", "once")) is None
    assert await bq.storage.head(keys.topic_marker("t")) is not None
