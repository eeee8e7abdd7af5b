"""Cursor logs belong to one incarnation of their topic (invariant I6, format 4).

A member that missed its topic's deletion and re-creation (its cached marker outlived the
deletion's wait) wrote its old cursor state into the purged prefix the new incarnation's log now
uses: a delta at its old number, a checkpoint of the old state, a forked log, one message under two
live leases (reproduction r9). Now cursor writes go through the topic fence as segment writes do
(started and acknowledged only with a marker copy younger than TOPIC_FENCE_S), deltas and
checkpoints carry the incarnation, and replicas, loads and GC refuse another incarnation's.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from bucketq import Bucketq
from bucketq.core import topics
from bucketq.core.cursor import Op
from bucketq.core.cursor_log import CursorLog
from bucketq.core.keys import seq_of
from bucketq.errors import LeaseLost, TopicDeleted, TopicNotFound
from bucketq.storage import MemoryStore
from bucketq.storage.faults import FaultyStore
from tests.support.engine_helpers import Backend, poll_one
from tests.support.virtual_tests import on_virtual_clock

FENCE_S = 0.4  # TOPIC_FENCE_S for these tests; deletions wait DELETE_WAIT_S > FENCE_S
DELETE_WAIT_S = 0.8


@pytest.fixture
def short_topic_fence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topics, "TOPIC_FENCE_S", FENCE_S)


async def _log_objects(bq: Bucketq, topic: str, group: str) -> dict[str, dict[int, dict]]:  # type: ignore[type-arg]
    out: dict[str, dict[int, dict]] = {"log": {}, "ckpt": {}}  # type: ignore[type-arg]
    for kind, prefix in (
        ("log", bq.keys.deltas_prefix(topic, group, 0)),
        ("ckpt", bq.keys.checkpoints_prefix(topic, group, 0)),
    ):
        async for info in bq.storage.list(prefix):
            n = seq_of(info.key, "json")
            blob = await bq.storage.get(info.key)
            if n is not None and blob is not None:
                out[kind][n] = json.loads(blob.data)
    return out


@pytest.mark.parametrize(
    "backend",
    ["file", pytest.param("moto", marks=pytest.mark.s3), pytest.param("seaweedfs", marks=pytest.mark.s3)],
    indirect=True,
)
async def test_a_member_running_across_deletion_and_recreation_never_forks_the_new_log(
    backend: Backend, short_topic_fence: None
) -> None:
    """r9: the member holds a lease when its topic is deleted and created again; another member
    joins the new topic; the first acks. The ack is refused (the topic is gone), nothing of the old
    incarnation lands in the new log, and the two members then never share a message.
    (The in-memory store's case is the next test, on the virtual clock.)"""
    await _a_member_across_deletion_never_forks_the_new_log(backend)


@on_virtual_clock
async def test_a_member_running_across_deletion_and_recreation_never_forks_the_new_log_in_memory(
    short_topic_fence: None,
) -> None:
    """The same on the in-memory store, where the fence's age, the deletion's wait and the polls
    are logic on the virtual clock."""
    b = Backend("memory", {"backend": "memory", "strategy": "conditional_write"}, MemoryStore())
    try:
        await _a_member_across_deletion_never_forks_the_new_log(b)
    finally:
        await b.close_all()


async def _a_member_across_deletion_never_forks_the_new_log(backend: Backend) -> None:
    blind = await backend.connect(consumer={"checkpoint_every": 2, "heartbeat_interval_s": 60})
    await blind.create_topic("t")
    p = await blind.register_producer("p")
    for i in range(8):
        await p.publish("t", f"old-{i}")
    m1 = await blind.register_consumer("g", "t", max_in_flight=1)
    for _ in range(5):  # several deltas and checkpoints: the old log's numbers run ahead
        await (await poll_one(m1)).ack()
    held = await poll_one(m1)

    admin = await backend.connect()
    await admin.catalog.delete("t", fence_wait_s=DELETE_WAIT_S)
    await admin.create_topic("t")
    fresh = await backend.connect(consumer={"checkpoint_every": 2})
    m2 = await fresh.register_consumer("g", "t")
    incarnation = (await admin.catalog.marker("t", fresh=True)).incarnation

    with pytest.raises((TopicDeleted, LeaseLost)):
        await held.ack()  # its lease went with the old topic
    await asyncio.sleep(0.3)  # a background checkpoint write would land by now
    stored = await _log_objects(admin, "t", "g")
    state = await CursorLog(admin.storage, admin.keys, "t", "g", 0, "probe").load()
    assert max(stored["log"]) == state.n, f"a delta beyond the new log's tip: {sorted(stored['log'])}"
    assert all(n <= state.n for n in stored["ckpt"]), f"an old checkpoint: {sorted(stored['ckpt'])}"
    assert {d.get("inc") for d in [*stored["log"].values(), *stored["ckpt"].values()]} == {incarnation}

    # the first member starts over on the new topic; both read it, never the same message twice
    for i in range(10):
        await p.publish("t", f"new-{i}")
    seen: dict[str, list[str]] = {}
    deadline = time.monotonic() + 20
    while sum(len(v) for v in seen.values()) < 10 and time.monotonic() < deadline:
        for member in (m1, m2):
            try:
                msgs = await member.poll(5, 0.2)
            except TopicNotFound:
                continue  # told once that its topic went away; it starts over on the new one
            for m in msgs:
                seen.setdefault(m.payload, []).append(member.member)
                await m.ack()
    assert sorted(seen) == [f"new-{i}" for i in range(10)]
    assert all(len(v) == 1 for v in seen.values()), f"delivered twice: {seen}"
    state = await CursorLog(admin.storage, admin.keys, "t", "g", 0, "probe").load()
    assert state.counters.acked == 10


@on_virtual_clock
async def test_a_delta_landing_after_the_purge_is_refused_and_never_applied(
    short_topic_fence: None,
) -> None:
    """A cursor write paused across the deletion and re-creation lands in the new incarnation's
    log: its writer is told the topic is gone, and the new log's replicas apply it as an empty
    delta (its number taken, none of its ops). On the virtual clock (in-memory store): the pause,
    the fence's age and the deletion's wait are the order of events, not real seconds."""
    faulty = FaultyStore(MemoryStore())
    old = Bucketq.builder().memory().build(store=faulty)
    await old.open()
    await old.create_topic("t")
    old_fence = old.catalog.fence("t", (await old.catalog.marker("t")).incarnation)
    writer = CursorLog(old.storage, old.keys, "t", "g", 0, "ghost", topic_fence=old_fence)
    await writer.load()
    await writer.commit(lambda s: [Op("start", 0)])
    faulty.add(op="PUT", match="*/log/*", kind="latency", latency_s=2.0, times=1)
    ghost = asyncio.create_task(writer.commit(lambda s: [Op("expire", 5, base=5)]))
    await asyncio.sleep(0.1)

    admin = Bucketq.builder().memory().build(store=faulty)
    await admin.open()
    await admin.catalog.delete("t", fence_wait_s=DELETE_WAIT_S)
    await admin.create_topic("t")
    new_fence = admin.catalog.fence("t", (await admin.catalog.marker("t")).incarnation)
    reader = CursorLog(admin.storage, admin.keys, "t", "g", 0, "new", topic_fence=new_fence)
    await reader.load()
    await reader.commit(lambda s: [Op("start", 0)])  # delta 1 of the new log
    with pytest.raises(TopicDeleted):
        await ghost  # landed at 2 in the new log's prefix, after the purge: not acknowledged
    assert await admin.storage.get(admin.keys.delta("t", "g", 0, 2)) is not None

    await reader.catch_up()
    assert reader.state.n == 2 and reader.state.floor == 0, "the ghost's expire was not applied"
    assert reader.foreign == 1 and "ghost" not in reader.state.ids
    again = await CursorLog(admin.storage, admin.keys, "t", "g", 0, "x", topic_fence=new_fence).load()
    assert again.to_json() == reader.state.to_json()
    with pytest.raises(TopicDeleted):
        await writer.commit(lambda s: [Op("seek", 1, base=1)])  # nothing more is even started
    assert await admin.storage.get(admin.keys.delta("t", "g", 0, 3)) is None
    await admin.close()
    await old.close()


async def test_loads_and_gc_pass_over_another_incarnations_checkpoints() -> None:
    """A checkpoint of the old incarnation at a number the new log has not reached: a load passes
    it over, and GC raises the trim fence only above this incarnation's checkpoints (the fence
    once rose above it, freeing deltas that no usable checkpoint covered)."""
    bq = Bucketq.builder().memory().build(store=MemoryStore())
    await bq.open()
    await bq.create_topic("t")
    fence = bq.catalog.fence("t", (await bq.catalog.marker("t")).incarnation)
    log = CursorLog(bq.storage, bq.keys, "t", "g", 0, "m", checkpoint_every=2, topic_fence=fence)
    await log.load()
    await log.commit(lambda s: [Op("start", 0)])
    for i in range(4):
        await log.commit(lambda s, i=i: [Op("seek", i + 1, base=i + 1)])
    await asyncio.sleep(0.05)  # checkpoints 2 and 4
    reference = log.state.to_json()
    for n in (40, 42):  # what a member of another incarnation left, above this log's tip
        body = {**reference, "n": n, "floor": 99, "inc": "another"}
        await bq.storage.create(bq.keys.checkpoint("t", "g", 0, n), json.dumps(body).encode())
    loaded = await CursorLog(bq.storage, bq.keys, "t", "g", 0, "r", topic_fence=fence).load()
    assert loaded.to_json() == reference
    report = await bq.collect_garbage(["t"])
    trim = json.loads((await bq.storage.get(bq.keys.log_trim("t", "g", 0))).data)  # type: ignore[union-attr]
    assert trim["floor"] == 3, "the trim fence rises above this incarnation's second-newest checkpoint"
    assert report.checkpoints == 0
    await bq.close()
