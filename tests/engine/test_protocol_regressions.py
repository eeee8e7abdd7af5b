"""Regression tests for the protocol flaws found by review (docs/protocol.md, invariants I1–I7).

Each test sets up the exact situation of one flaw and asserts the invariant it broke. GC frees in
two phases with real grace periods (minutes); here the fences' trust windows are shortened and GC
gets a matching short grace, so real waits of about a second stand for them — the same inequality
(trust < grace) that makes the protocol safe holds.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bucketq import Bucketq
from bucketq.core import cursor_log, partition_worker, segment_writer
from bucketq.core.cursor import Op
from bucketq.core.cursor_log import CursorLog
from bucketq.core.keys import Keys
from bucketq.core.segment import encode_segment
from bucketq.core.segment_writer import SegmentWriter
from bucketq.errors import LeaseLost, PublishTimeout, StorageError, TopicDeleted, TopicNotFound
from bucketq.storage import MemoryStore, Storage
from bucketq.storage.faults import FaultyStore
from tests.support.engine_helpers import Backend, drain, poll_one

TRUST_S = 0.3
GRACE_S = 1.0


@pytest.fixture
def short_fences(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fence copies trusted for TRUST_S (GC is called with GRACE_S > TRUST_S)."""
    monkeypatch.setattr(segment_writer, "SEGMENT_TRUST_S", TRUST_S)
    monkeypatch.setattr(partition_worker, "SEGMENT_TRUST_S", TRUST_S)
    monkeypatch.setattr(cursor_log, "DELTA_TRUST_S", TRUST_S)
    yield


async def collect_twice(bq: Bucketq, topic: str, *, frees_below: int = 1, partition: int = 0) -> None:
    """A collection that raises fences, and rounds after the grace until every segment of
    ``partition`` below ``frees_below`` is freed (each test's premise is that GC freed them)."""
    reports = [await bq.collect_garbage([topic], segment_grace_s=GRACE_S, delta_grace_s=GRACE_S)]
    # a loaded machine may need more rounds: the consumer's last commits can land after the first
    # collection raised the fences, which then frees only part of what the test needs freed
    for _ in range(5):
        await asyncio.sleep(GRACE_S + 1.1)  # store clocks may count whole seconds
        reports.append(await bq.collect_garbage([topic], segment_grace_s=GRACE_S, delta_grace_s=GRACE_S))
        if not await _segments_left(bq, topic, partition, frees_below):
            break
    assert reports[0].segments + reports[0].deltas == 0, f"freed before the grace: {reports[0]}"
    left = await _segments_left(bq, topic, partition, frees_below)
    if not left:
        return
    fences = [await bq.storage.get(bq.keys.segment_floor(topic, p)) for p in range(4)]
    raise AssertionError(
        f"the setup must free segments {left} of p{partition}; collections {reports}, fences {fences}"
    )


async def _segments_left(bq: Bucketq, topic: str, partition: int, below: int) -> list[int]:
    return [
        seq
        for seq in range(below)
        if await bq.storage.get(bq.keys.segment(topic, partition, seq)) is not None
    ]


# -- I1: a number once taken is never taken again ------------------------------------------------


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_stale_cached_tail_after_gc_still_delivers(backend: Backend, short_fences: None) -> None:
    """r1: a producer whose cached tail points into numbers GC freed must not lose its publish."""
    bq = await backend.connect()
    await bq.create_topic("t", retention_seconds=0.001)
    stale = await bq.register_producer("stale")
    await stale.publish("t", "a0")  # caches next_seq = 1
    fresh = await bq.register_producer("fresh")
    for i in range(3):
        await fresh.publish("t", f"b{i}")
    consumer = await bq.register_consumer("c", "t")
    await drain(consumer, 4)
    await asyncio.sleep(0.3)
    await collect_twice(bq, "t", frees_below=4)
    result = await stale.publish("t", "after-gc")  # its cached number 1 was freed
    assert result.seq == 4, "written again at the real tail"
    assert stale.appender("t", 0).writer.orphans == 1
    got = await poll_one(consumer)
    assert got.payload == "after-gc"


HELD_S = 5.0  # the held publish answers after this: longer than the reads, acks and GC below


async def _held_publish_beside_a_reader() -> tuple[Bucketq, Any, Any, Any]:
    """A producer whose second segment lands at once but whose answer is held up (a paused
    process): returns the app, the producer, the publish task and the consumer."""
    faulty = FaultyStore(MemoryStore())
    bq = Bucketq.builder().memory().build(store=faulty)
    await bq.open()
    await bq.create_topic("t", partitions=1, retention_seconds=0.001)
    consumer = await bq.register_consumer("c", "t")
    producer = await bq.register_producer("p")
    # no publish before: rings would have proved the path, and an idle member then waits for one
    faulty.add(op="PUT", match="*/seg/*", kind="held_response", latency_s=HELD_S)
    publishing = asyncio.create_task(producer.publish("t", "held"))  # reads the fence, then puts
    got = await poll_one(consumer)  # the segment is durable: readers see it while its writer waits
    assert (got.payload, got.seq) == ("held", 0)
    await got.ack()
    await asyncio.sleep(TRUST_S)  # the writer's copy of the fence is no longer trusted
    return bq, producer, publishing, consumer


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_a_segment_read_and_fenced_while_its_writer_was_held_up_is_not_written_again(
    short_fences: None,
) -> None:
    """r12 (chaos, SeaweedFS, seed 1034465621): a producer paused between its segment landing and
    its look at the fence met a floor GC had raised because readers consumed that very segment,
    took it for an orphan in a freed number and wrote the batch again: one message stored at two
    positions, delivered twice. The store's times tell the two apart (I1)."""
    bq, producer, publishing, consumer = await _held_publish_beside_a_reader()
    await bq.collect_garbage(["t"], segment_grace_s=GRACE_S, delta_grace_s=GRACE_S)
    fence = await bq.storage.get(bq.keys.segment_floor("t", 0))
    assert fence is not None and json.loads(fence.data)["floor"] == 1, "GC must raise the floor past it"
    assert not publishing.done(), (
        f"the held answer came before GC raised the floor (raise HELD_S above {HELD_S})"
    )
    result = await publishing
    assert result.seq == 0, "acknowledged where it was read"
    assert producer.appender("t", 0).writer.orphans == 0
    assert await consumer.poll(max_messages=10, wait=1.0) == [], "stored and delivered once"
    stored = [info.key async for info in bq.storage.list(bq.keys.segments_prefix("t", 0))]
    assert [k.rsplit("/", 1)[1] for k in stored] == ["0000000000000000.jsonl"]


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_a_segment_collected_while_its_writer_was_held_up_is_not_acknowledged_nor_written_again(
    short_fences: None,
) -> None:
    """r12, when GC has also deleted the segment before its writer looks: nothing on the store
    tells a consumed segment from an orphan any more, so the publish fails unacknowledged (the
    message was delivered once) instead of storing the batch a second time."""
    bq, _, publishing, consumer = await _held_publish_beside_a_reader()
    await collect_twice(bq, "t", frees_below=1)
    assert not publishing.done(), "the held answer came before GC freed the segment"
    with pytest.raises(PublishTimeout, match="not acknowledged"):
        await publishing
    assert await consumer.poll(max_messages=10, wait=1.0) == [], "delivered once"
    stored = [info.key async for info in bq.storage.list(bq.keys.segments_prefix("t", 0))]
    assert stored == [], "nothing written again"


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_stale_head_hint_after_gc_still_delivers(backend: Backend, short_fences: None) -> None:
    """r1b: a fresh producer trusting a stale head.json (left by a killed producer) must not write
    into freed numbers."""
    bq = await backend.connect()
    await bq.create_topic("t", retention_seconds=0.001)
    p = await bq.register_producer("p")
    for i in range(3):
        await p.publish("t", i)
    consumer = await bq.register_consumer("c", "t")
    await drain(consumer, 3)
    await asyncio.sleep(0.3)
    await collect_twice(bq, "t", frees_below=3)
    keys = Keys(bq.settings.root)
    await bq.storage.overwrite(keys.head("t", 0), json.dumps({"seq": 0, "next_offset": 1, "at": 0}).encode())
    newcomer = await bq.register_producer("newcomer")
    result = await newcomer.publish("t", "new")
    assert result.seq == 3
    assert (await poll_one(consumer)).payload == "new"


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_delta_put_into_a_freed_number_is_rejected_and_reloaded(short_fences: None) -> None:
    """r2: a member whose delta write stalls past GC's grace lands in a freed number: the write is
    an orphan, the member reloads, and its replica equals a fresh load (no fork)."""
    faulty = FaultyStore(MemoryStore())
    storage = Storage(faulty)
    keys = Keys()
    b = CursorLog(storage, keys, "t", "c", 0, "B", checkpoint_every=4)
    await b.commit(lambda s: [Op("start", seq=0, base=0)])
    a = CursorLog(storage, keys, "t", "c", 0, "A", checkpoint_every=4)
    await a.load()
    for _ in range(20):
        await b.commit(lambda s: [Op("seen", s.frontier + 1, count=1, base=s.frontier + 1)])
    await asyncio.sleep(0.1)  # background checkpoints
    assert a.state.n == 1
    # A's next PUT (delta 2) stalls; meanwhile GC fences and frees deltas below the trim fence
    faulty.add(op="PUT", match="*/log/0000000000000002.json", kind="latency", latency_s=3.5, times=1)
    bq = Bucketq.builder().memory().build(store=faulty)
    await bq.open()
    await bq.catalog.create("t")
    commit = asyncio.create_task(
        a.commit(lambda s: [Op("seen", s.frontier + 1, count=1, base=s.frontier + 1)])
    )
    await asyncio.sleep(0.05)
    await bq.collect_garbage(["t"], delta_grace_s=GRACE_S)
    await asyncio.sleep(GRACE_S + 1.1)
    report = await bq.collect_garbage(["t"], delta_grace_s=GRACE_S)
    assert report.deltas > 0 and await storage.get(keys.delta("t", "c", 0, 2)) is None
    outcome = await commit
    assert outcome is not None and a.orphans == 1
    assert outcome.delta.n == 22, "written again at the real tip after a reload"
    fresh = await CursorLog(storage, keys, "t", "c", 0, "X").load()
    assert fresh.to_json() == a.state.to_json()


class AnswersLate(MemoryStore):
    """A PUT of ``late_key`` is done at once and answered ``late_s`` later (the member paused
    between its write and the answer)."""

    def __init__(self, late_key: str, late_s: float) -> None:
        super().__init__()
        self.late_key, self.late_s = late_key, late_s

    async def put(self, key: str, data: bytes, **conditions: Any) -> str:
        etag = await super().put(key, data, **conditions)
        if key == self.late_key:
            self.late_key = ""
            await asyncio.sleep(self.late_s)
        return etag


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_a_delta_answered_after_gc_freed_its_number_is_recognised_not_written_again(
    short_fences: None,
) -> None:
    """A member's delta lands, then the member pauses before the answer; meanwhile the group writes
    on, checkpoints cover the delta and GC frees its number. The late answer cannot tell a landed
    delta from an orphan, so the member reloads: the checkpoint names the delta its newest, so its
    ops count as applied (I3), judged from the state, and are not written a second time."""
    keys = Keys()
    store = AnswersLate(keys.delta("t", "c", 0, 2), late_s=3.5)
    storage = Storage(store)
    b = CursorLog(storage, keys, "t", "c", 0, "B", checkpoint_every=4)
    await b.commit(lambda s: [Op("start", seq=0, base=0)])
    a = CursorLog(storage, keys, "t", "c", 0, "A", checkpoint_every=4)
    await a.load()
    seen = Op("seen", 0, count=1, base=0)
    commit = asyncio.create_task(a.commit(lambda s: [seen]))
    await asyncio.sleep(0.05)  # delta 2 is stored; A waits for its answer
    for _ in range(20):  # B catches up over A's delta and writes on, with checkpoints
        await b.commit(lambda s: [Op("seen", s.frontier + 1, count=1, base=s.frontier + 1)])
    await asyncio.sleep(0.1)  # background checkpoints
    bq = Bucketq.builder().memory().build(store=store)
    await bq.open()
    await bq.catalog.create("t")
    await bq.collect_garbage(["t"], delta_grace_s=GRACE_S)
    await asyncio.sleep(GRACE_S + 1.1)
    report = await bq.collect_garbage(["t"], delta_grace_s=GRACE_S)
    assert report.deltas > 0 and await storage.get(keys.delta("t", "c", 0, 2)) is None
    outcome = await commit
    assert outcome is not None and outcome.delta.n == 2 and outcome.results == [True]
    assert a.orphans == 0, "a landed delta taken for an orphan"
    fresh = await CursorLog(storage, keys, "t", "c", 0, "X").load()
    assert fresh.to_json() == a.state.to_json()
    assert fresh.frontier == 20, "A's seen op applied once, B's twenty after it"


async def test_recreated_topic_continues_numbers(backend: Backend) -> None:
    """Deleting a topic leaves floor tombstones: the new topic's numbers never reuse the old ones."""
    bq = await backend.connect()
    await bq.create_topic("t")
    p = await bq.register_producer("p")
    for i in range(3):
        await p.publish("t", i)
    await bq.catalog.delete("t", fence_wait_s=0.2)
    await bq.create_topic("t")
    result = await p.publish("t", "new")
    assert result.seq == 3
    consumer = await bq.register_consumer("c", "t")
    assert [m.payload for m in (await drain_messages(consumer, 1))] == ["new"]


async def drain_messages(consumer, n: int):  # type: ignore[no-untyped-def]
    out = []
    deadline = time.monotonic() + 20
    while len(out) < n and time.monotonic() < deadline:
        for m in await consumer.poll(10, 0.2):
            out.append(m)
            await m.ack()
    return out


# -- I6: topic deletion fences writers and tells readers ----------------------------------------


async def test_deleting_a_topic_fences_publishes_and_tells_consumers(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bucketq.core import topics

    monkeypatch.setattr(topics, "TOPIC_FENCE_S", 0.5)  # the deleter waits longer: 1.0 s
    bq = await backend.connect()
    await bq.create_topic("t")
    p = await bq.register_producer("p")
    await p.publish("t", "before")
    consumer = await bq.register_consumer("c", "t", heartbeat_interval_s=0.2)
    await drain(consumer, 1)
    other = await backend.connect()
    deletion = asyncio.create_task(other.catalog.delete("t", fence_wait_s=1.0))
    await asyncio.sleep(0.1)  # marked "deleting"; the producer's cached marker is older than that
    acknowledged_at: list[float] = []
    with pytest.raises(TopicNotFound):
        for _ in range(50):
            await p.publish("t", "during")  # acknowledged only within the topic fence window
            acknowledged_at.append(time.monotonic())
            await asyncio.sleep(0.05)
    purge_started = time.monotonic()
    await deletion
    assert all(t < purge_started for t in acknowledged_at)
    keys = Keys(bq.settings.root)
    left = [i.key async for i in bq.storage.list(keys.topic_prefix("t"))]
    assert all(k.endswith("/floor.json") for k in left), left
    with pytest.raises(TopicNotFound):
        for _ in range(50):
            await consumer.poll(1, 0.2)


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_write_paused_across_deletion_and_recreation_is_not_acknowledged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A writer whose PUT completes after the topic was deleted and created again is told so,
    and readers of the new topic skip what it wrote."""
    from bucketq.core import topics

    monkeypatch.setattr(topics, "TOPIC_FENCE_S", 0.3)  # the deleter below waits 0.5 s
    faulty = FaultyStore(MemoryStore())
    bq = Bucketq.builder().memory().build(store=faulty)
    await bq.open()
    await bq.create_topic("t")
    writer = SegmentWriter(bq.storage, bq.keys, "t", 0, "w", catalog=bq.catalog)
    await writer.append([b'{"id":"1","payload":1}'], "batch-1")
    faulty.add(op="PUT", match="*/seg/*", kind="latency", latency_s=1.5, times=1)
    write = asyncio.create_task(writer.append([b'{"id":"2","payload":"ghost"}'], "batch-2"))
    await asyncio.sleep(0.1)
    admin = Bucketq.builder().memory().build(store=faulty)
    await admin.open()
    await admin.catalog.delete("t", fence_wait_s=0.5)
    await admin.create_topic("t")
    with pytest.raises(TopicDeleted):
        await write
    p = await admin.register_producer("p")
    await p.publish("t", "real")
    consumer = await admin.register_consumer("c", "t")
    got = [m.payload for m in await drain_messages(consumer, 1)]
    await asyncio.sleep(0.5)
    got += [m.payload for m in await consumer.poll(10, 0.3)]
    assert got == ["real"], "the ghost write of the old topic is skipped"
    await admin.close()
    await bq.close()


# -- I3: a delta is applied once, whatever happened to its response -----------------------------


async def test_landed_delta_seen_by_catch_up_is_not_applied_twice() -> None:
    """r5: the delta landed, its response was lost, retries failed, a catch-up applied it; the next
    commit resolves it instead of applying it again (no ValueError, no dead loop)."""
    faulty = FaultyStore(MemoryStore())
    storage = Storage(faulty)
    keys = Keys()
    log = CursorLog(storage, keys, "t", "c", 0, "A", max_attempts=1)
    await log.commit(lambda s: [Op("start", seq=0, base=0)])
    faulty.add(op="PUT", match="*/log/*", kind="drop_after_write", times=1)
    with pytest.raises(StorageError):
        await log.commit(lambda s: [Op("seen", 0, count=2, base=0)])
    assert log._inflight is not None
    await log.catch_up(via_checkpoint=True)  # a foreign cycle's catch-up applies it
    outcome = await log.commit(lambda s: [])
    assert outcome is not None and outcome.delta.n == 2 and outcome.results == [True]
    assert log.state.n == 2 and log.state.frontier == 0
    assert (await CursorLog(storage, keys, "t", "c", 0, "X").load()).to_json() == log.state.to_json()


async def test_ack_whose_response_was_lost_returns_ok(backend: Backend) -> None:
    faulty = FaultyStore(MemoryStore()) if backend.name == "memory" else None
    if faulty is None:
        pytest.skip("fault injection wraps the in-memory store")
    bq = await backend.connect(store=faulty)
    await bq.create_topic("t")
    p = await bq.register_producer("p")
    await p.publish("t", 1)
    c = await bq.register_consumer("c", "t")
    msg = await poll_one(c)
    faulty.add(op="PUT", match="*/log/*", kind="drop_after_write", times=1)
    await msg.ack()
    assert c._error is None
    fresh = await CursorLog(bq.storage, bq.keys, "t", "c", 0, "X").load()
    assert fresh.is_done((msg.seq, msg.index))


async def test_newest_checkpoint_vanishing_during_load_is_looked_for_again() -> None:
    """load() never mistakes a checkpoint deleted between LIST and GET for an empty log."""
    store = MemoryStore()
    storage = Storage(store)
    keys = Keys()
    writer = CursorLog(storage, keys, "t", "c", 0, "W", checkpoint_every=2)
    await writer.commit(lambda s: [Op("start", seq=0, base=0)])
    for _ in range(5):
        await writer.commit(lambda s: [Op("seen", s.frontier + 1, count=1, base=s.frontier + 1)])
    await asyncio.sleep(0.05)
    original_get = store.get
    vanished: list[str] = []

    async def get(key: str):  # type: ignore[no-untyped-def]
        if "/ckpt/" in key and not vanished:
            vanished.append(key)
            await store.delete([key])  # GC got there between our LIST and GET
        return await original_get(key)

    store.get = get  # type: ignore[method-assign]
    state = await CursorLog(storage, keys, "t", "c", 0, "R").load()
    assert vanished and state.n == writer.state.n and state.started


# -- I4: a message reaches the app only while its lease is durably held ----------------------------


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_prefetched_lease_not_extended_durably_is_never_handed_out(backend: Backend) -> None:
    """r3: a member whose extends cannot commit (paused, cut off) must not hand out prefetched
    messages once their durable lease ran out — another member may hold them."""
    if backend.name != "memory":
        pytest.skip("fault injection wraps the in-memory store")
    faulty = FaultyStore(MemoryStore())
    bq_a = await backend.connect(store=faulty)
    await bq_a.create_topic("t")
    p = await bq_a.register_producer("p")
    for i in range(5):
        await p.publish("t", i)
    a = await bq_a.register_consumer("c", "t", visibility_timeout_s=1.0, clock_skew_s=0.0, max_in_flight=5)
    deadline = time.monotonic() + 10
    while len(a._buffer) < 5 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert len(a._buffer) == 5, "prefetched, not yet handed out"
    faulty.add(op="PUT", match="*/log/*", kind="error", times=None)  # its extends never commit
    await asyncio.sleep(1.3)
    assert await a.poll(10, 0.1) == []
    a.pause()  # A claims nothing more: the messages are B's to take
    faulty.clear()
    bq_b = await backend.connect(store=faulty)
    b = await bq_b.register_consumer("c", "t", visibility_timeout_s=30, clock_skew_s=0.0)
    got = await drain(b, 5)
    assert len(got) == 5
    assert await a.poll(10, 0.5) == [], "nothing B holds is handed out by A"


# -- I5: a subscription never skips what its start position covers -------------------------------


async def test_latest_subscription_gets_partitions_added_later(backend: Backend) -> None:
    """r6: messages published to a partition added after a ``latest`` subscription began."""
    bq = await backend.connect()
    await bq.create_topic("t", partitions=1)
    c = await bq.register_consumer("c", "t", start_position="latest", heartbeat_interval_s=0.3)
    from bucketq import TopicConfig

    await bq.update_topic("t", TopicConfig(partitions=3))
    admin = await backend.connect()
    p = await admin.register_producer("p")
    ids = {(await p.publish("t", i, key=f"k{i}")).id for i in range(12)}
    got = await drain(c, 12)
    assert set(got) == ids


async def test_join_returns_only_once_every_cursor_started(backend: Backend) -> None:
    """A store failure while a joining member starts its cursors is retried: when the join
    returns, the start position is fixed on every partition, so a publish acknowledged after the
    join is delivered (``latest`` would otherwise start past it)."""
    if backend.name != "memory":
        pytest.skip("fault injection wraps the in-memory store")
    faulty = FaultyStore(MemoryStore())
    bq = await backend.connect(store=faulty)
    await bq.create_topic("t", partitions=3)
    faulty.add(op="GET", match="*/trim.json", kind="error", times=4)
    c = await bq.register_consumer("c", "t", start_position="latest")
    assert all(w.state.started for w in c._subs["t"].workers.values())
    p = await bq.register_producer("p")
    ids = {(await p.publish("t", i, key=f"k{i}")).id for i in range(6)}
    assert set(await drain(c, 6)) == ids


async def test_join_fails_when_the_store_does_not_recover(backend: Backend) -> None:
    """A join whose cursors cannot be started fails with the store's error and leaves the group."""
    if backend.name != "memory":
        pytest.skip("fault injection wraps the in-memory store")
    faulty = FaultyStore(MemoryStore())
    bq = await backend.connect(store=faulty)
    await bq.create_topic("t", partitions=2)
    faulty.add(op="PUT", match="*/log/*", kind="error", times=None)
    with pytest.raises(StorageError):
        await bq.register_consumer("c", "t", max_commit_attempts=3)
    faulty.clear()
    members = [info.key async for info in bq.storage.list(Keys(bq.settings.root).members_prefix("t", "c"))]
    assert members == [], "the failed join left the group"


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_new_earliest_subscription_racing_gc_moves_on(backend: Backend, short_fences: None) -> None:
    """r4: a subscription whose start landed after GC freed its first segments skips them,
    counted, instead of stalling."""
    bq = await backend.connect()
    await bq.create_topic("t", retention_seconds=0.001)
    p = await bq.register_producer("p")
    for i in range(4):
        await p.publish("t", i)
    first = await bq.register_consumer("first", "t")
    await drain(first, 4)
    await asyncio.sleep(0.3)
    await collect_twice(bq, "t", frees_below=4)
    # the late subscription decided "earliest = segment 0" before GC freed it
    late_log = CursorLog(bq.storage, bq.keys, "t", "late", 0, "init")
    await late_log.commit(lambda s: [Op("start", seq=0, base=0)])
    late = await bq.register_consumer("late", "t")
    await p.publish("t", "fresh")
    assert (await poll_one(late)).payload == "fresh"
    state = late._subs["t"].workers[0].state
    assert state.counters.collected == 4


# -- I7: an idempotent publish is stored once ------------------------------------------------------


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_dedup_publish_of_unknown_outcome_is_stored_once(backend: Backend) -> None:
    """r7: the segment landed but the publish timed out; the retry with the same dedup id finds it."""
    if backend.name != "memory":
        pytest.skip("fault injection wraps the in-memory store")
    faulty = FaultyStore(MemoryStore())
    bq = await backend.connect(store=faulty, producer={"publish_timeout_s": 1.0})
    await bq.create_topic("t")
    p = await bq.register_producer("p")
    await p.publish("t", "warm-up")  # the writer knows the tail
    faulty.add(op="PUT", match="*/seg/*", kind="drop_after_write", times=1)
    faulty.add(op="GET", match="*/seg/*", kind="error", times=None)
    with pytest.raises(PublishTimeout):
        await p.publish("t", "order-42", dedup_id="order-42")
    faulty.clear()
    await asyncio.sleep(1.1)  # the pending marker's writer has given up
    again = await (await bq.register_producer("p2")).publish("t", "order-42", dedup_id="order-42")
    assert again.duplicate
    stored = []
    async for info in bq.storage.list(bq.keys.segments_prefix("t", 0)):
        blob = await bq.storage.get(info.key)
        stored.append(blob.data.count(b"order-42"))  # type: ignore[union-attr]
    assert sum(1 for n in stored if n) == 1


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_a_takeover_that_fails_keeps_where_the_first_attempt_may_have_landed(backend: Backend) -> None:
    """Found by the simulation (seed 1194): the first publish landed but its marker stayed pending;
    a second attempt took the marker over, recording only the tail of its own time, and failed
    while scanning; a third attempt scanned from that tail, missed the first copy and stored a
    second one. A takeover now keeps every attempt's scan position."""
    if backend.name != "memory":
        pytest.skip("fault injection wraps the in-memory store")
    faulty = FaultyStore(MemoryStore())
    bq = await backend.connect(store=faulty, producer={"publish_timeout_s": 1.0})
    await bq.create_topic("t")
    p = await bq.register_producer("p")
    await p.publish("t", "warm-up")
    first = await p.publish("t", "order-7", dedup_id="order-7")
    # as if the first writer's marker commit never landed: the marker stays pending, abandoned
    marker = {"state": "pending", "id": first.id, "at": time.time() - 10, "partition": 0}
    marker["from_seq"] = first.seq
    await bq.storage.overwrite(bq.keys.dedup("t", "order-7"), json.dumps(marker).encode())
    for i in range(3):
        await p.publish("t", f"later-{i}")  # the tail moves on
    await asyncio.sleep(1.1)
    await p.publish("t", "later-3")  # and the head hint follows it (written at most once a second)
    # the takeover's scan fails on the first copy's segment (finding the tail still works)
    faulty.add(op="GET", match=bq.keys.segment("t", 0, first.seq), kind="error", times=None)
    with pytest.raises(StorageError):
        await (await bq.register_producer("p2")).publish("t", "order-7", dedup_id="order-7")
    faulty.clear()
    await asyncio.sleep(1.1)  # and the second writer gives up too
    third = await (await bq.register_producer("p3")).publish("t", "order-7", dedup_id="order-7")
    assert third.duplicate and (third.seq, third.index) == (first.seq, first.index)
    stored = 0  # segments holding the message (its payload and dedup id are both "order-7")
    async for info in bq.storage.list(bq.keys.segments_prefix("t", 0)):
        blob = await bq.storage.get(info.key)
        stored += b'"dedup_id":"order-7"' in blob.data  # type: ignore[union-attr]
    assert stored == 1


# -- I9: per-key order holds for any number of open segments ----------------------------------------


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_ordered_delivery_with_more_open_segments_than_the_window(backend: Backend) -> None:
    """r8: a member restarting with > 64 open segments never delivers a later record of a key
    before earlier ones."""
    if backend.name not in ("memory", "file"):
        pytest.skip("70 segments: the in-process backends suffice")
    bq = await backend.connect()
    await bq.create_topic("t")
    p = await bq.register_producer("p")
    for i in range(68):
        await p.publish("t", f"o{i}", key="o")
    for i in range(4):
        await p.publish("t", f"K{i}", key="K")
    c1 = await bq.register_consumer("c", "t", ordered=True, max_in_flight=1)
    worker = c1._subs["t"].workers[0]
    deadline = time.monotonic() + 30
    while worker.state.frontier < 71 and time.monotonic() < deadline:
        for m in await c1.poll(1, 0.5):
            await m.ack()
    await c1.close()
    c2 = await (await backend.connect()).register_consumer("c", "t", ordered=True, max_in_flight=10)
    await p.publish("t", "K4", key="K")
    got: list[str] = []
    for _ in range(10):
        got += [m.payload for m in await c2.poll(10, 0.3)]
    if "K4" in got:
        assert all(f"K{i}" in got[: got.index("K4")] for i in range(4) if f"K{i}" in got), got


# -- I8: no lost response, 412 storm, outage or bad object ends a loop -------------------------------


async def test_segment_writer_gives_up_after_max_attempts_of_412() -> None:
    faulty = FaultyStore(MemoryStore())
    storage = Storage(faulty)
    faulty.add(op="PUT", match="*/seg/*", kind="precondition", times=None)
    writer = SegmentWriter(storage, Keys(), "t", 0, "w", max_attempts=5, timeout_s=60)
    with pytest.raises(PublishTimeout, match="5 attempts"):
        await writer.append([b'{"id":"1"}'], "b")


async def test_undecodable_segment_is_skipped_and_counted(backend: Backend) -> None:
    bq = await backend.connect()
    await bq.create_topic("t")
    keys = Keys(bq.settings.root)
    await bq.storage.create(
        keys.segment("t", 0, 0), b'{"v":1,"topic":"t","partition":0,"seq":0,"count":2,"base":0}\nnot json\n'
    )
    p = await bq.register_producer("p")
    await p.publish("t", "after")
    c = await bq.register_consumer("c", "t")
    assert (await poll_one(c)).payload == "after"
    assert c._subs["t"].workers[0].state.counters.corrupt == 1


# -- I10: a clock off by more than the margin is reported ------------------------------------------


async def test_clock_far_ahead_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    storage = Storage(MemoryStore())
    keys = Keys()
    ahead = CursorLog(storage, keys, "t", "c", 0, "ahead", clock=lambda: time.time() + 60)
    await ahead.commit(lambda s: [Op("start", seq=0, base=0)])
    reader = CursorLog(storage, keys, "t", "c", 0, "reader", clock_skew_s=2.0)
    with caplog.at_level("WARNING", logger="bucketq.cursor"):
        await reader.load()
    assert reader.skew_seen > 50
    assert "ahead of ours" in caplog.text


# -- I3, I4: a member cut off past its lease is told LeaseLost, and its log never forks -------------


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_lease_lost_after_outage_is_reported_not_forked(short_fences: None) -> None:
    """r2b: a member cut off past its lease gets LeaseLost for its ack, and never a fork."""
    faulty = FaultyStore(MemoryStore())
    bq_a = (
        Bucketq.builder()
        .memory()
        .consumer(visibility_timeout_s=1.0, clock_skew_s=0.0, max_commit_attempts=2)
        .build(store=faulty)
    )
    await bq_a.open()
    await bq_a.create_topic("t")
    p = await bq_a.register_producer("p")
    await p.publish("t", "m0")
    a = await bq_a.register_consumer("c", "t")
    msg = await poll_one(a)
    faulty.add(op="*", match="*/log/*", kind="error", times=None)
    ack = asyncio.create_task(msg.ack())
    await asyncio.sleep(1.3)
    bq_b = Bucketq.builder().memory().consumer(clock_skew_s=0.0).build(store=faulty.inner)
    await bq_b.open()
    b = await bq_b.register_consumer("c", "t")
    again = await poll_one(b)
    await again.ack()
    faulty.clear()
    with pytest.raises(LeaseLost):
        await asyncio.wait_for(ack, 30)
    fresh = await CursorLog(bq_b.storage, bq_b.keys, "t", "c", 0, "X").load()
    replica = a._subs["t"].workers[0].log
    await replica.catch_up()
    assert fresh.to_json() == replica.state.to_json()


def test_segment_header_round_trips_incarnation() -> None:
    from bucketq.core.segment import SegmentHeader, decode_header

    header = SegmentHeader("t", 0, 3, 1, 7, "p", 1.0, "b", incarnation="abc")
    assert decode_header(encode_segment(header, [b"{}"])).incarnation == "abc"


@pytest.mark.parametrize("older", [1, 2, 3, 4, 5])
async def test_older_buckets_are_upgraded_and_newer_formats_are_refused(older: int) -> None:
    from bucketq.errors import BucketqError

    store = MemoryStore()
    keys = Keys()
    await store.put(keys.format_marker(), b'{"format": %d}' % older)
    bq = Bucketq.builder().memory().build(store=store)
    await bq.open()
    assert json.loads((await store.get(keys.format_marker())).data) == {"format": 6}  # type: ignore[union-attr]
    await bq.close()
    await store.put(keys.format_marker(), b'{"format": 7}')
    with pytest.raises(BucketqError, match="format 7; this version speaks 6: upgrade bucketq"):
        await Bucketq.builder().memory().build(store=store).open()
