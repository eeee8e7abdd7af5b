"""An idle queue is cheap and still picks up fast (invariant I13, core/wake.py).

While a member's topics are idle it polls one wake object per topic instead of every partition,
heartbeats rarely (announcing a longer TTL) and polls partitions only at a slow fallback. A
producer's first append after a quiet spell touches the wake object; a lost touch only delays
pickup to the fallback poll.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter

from bucketq.bench.metered import MeteredStore, key_kind
from bucketq.core.cadence import WAKE_SHARE_MAX, next_wake_turn
from bucketq.core.membership import Membership, owned_partitions
from bucketq.core.producer import partition_for_key
from bucketq.core.stats import live_members
from bucketq.core.wake import WakeWatch, touch_wake
from bucketq.errors import StorageError
from bucketq.storage.memory import MemoryStore
from tests.support.engine_helpers import Backend
from tests.support.virtual_tests import on_virtual_clock

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


@on_virtual_clock
async def test_an_idle_member_polls_the_wake_object_not_the_partitions() -> None:
    store = MeteredStore(MemoryStore())
    took, idle = await _pickup(store)
    assert took < 2.0, f"pickup after silence took {took:.2f}s (the fallback is 60 s: the wake failed)"
    # two idle seconds: ~20 wake polls (100 ms), no partition polls (fallback 60 s), no heartbeat
    assert idle["GET wake"] >= 5, idle
    assert idle["GET segment"] == 0, idle
    assert idle["PUT member"] == 0 and idle["LIST member"] == 0, idle


@on_virtual_clock
async def test_a_lost_wake_touch_only_delays_pickup_to_the_fallback() -> None:
    store = _RefusingWakes(MemoryStore())
    took, _ = await _pickup(store, poll_idle_ms=1500)
    # on the virtual clock the bound is exact: the fallback's period plus a cycle's slack (a bound
    # of 6 s passed with a 9 s fallback: it did not prove that the fallback carries pickup)
    assert took < 1.5 + 0.5, f"pickup took {took:.2f}s with a 1.5 s fallback"


@on_virtual_clock
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


@on_virtual_clock
async def test_wake_watch_sees_changes_and_why() -> None:
    b = Backend("memory", {"backend": "memory", "strategy": "conditional_write"}, MemoryStore())
    bq = await b.connect()
    watch = WakeWatch(bq.storage, bq.keys, "t")
    assert await watch.look() is None  # nothing there yet
    assert await touch_wake(bq.storage, bq.keys, "t", "me")
    assert await watch.look() == "publish"
    assert await watch.look() is None
    await asyncio.sleep(0.01)
    await touch_wake(bq.storage, bq.keys, "t", "member-2", "members")
    assert await watch.look() == "members"
    await asyncio.sleep(0.01)
    await touch_wake(bq.storage, bq.keys, "t", "me")
    assert await watch.look() == "publish"
    # a reader's first look counts an old producer touch as a change to look at once, not as
    # a topic turning busy; a fresh one as busy; an unreadable body as busy
    late = WakeWatch(bq.storage, bq.keys, "t")
    assert await late.look() == "publish"
    await bq.storage.overwrite(bq.keys.wake("t"), b'{"at": 0, "by": "p", "why": "publish"}')
    assert await WakeWatch(bq.storage, bq.keys, "t").look() == "members"
    await bq.storage.overwrite(bq.keys.wake("t"), b"not json")
    assert await watch.look() == "publish"
    await b.close_all()


@on_virtual_clock
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


# -- idle members take turns at the wake object -------------------------------------------------


def test_idle_members_take_turns_one_poll_per_slot() -> None:
    """With up to WAKE_SHARE_MAX members, every slot has exactly one member's turn; each member
    polls once per round of min(members, WAKE_SHARE_MAX) slots."""
    poll = 2.0
    for members in range(1, WAKE_SHARE_MAX + 3):
        seats = min(members, WAKE_SHARE_MAX)
        turns: dict[int, list[float]] = {}
        for rank in range(members):
            at, mine = 1000.3, []
            for _ in range(6):
                at = next_wake_turn(at, poll, rank, members)
                mine.append(at)
            turns[rank] = mine
            gaps = {round(b - a, 6) for a, b in itertools.pairwise(mine)}
            assert gaps == {seats * poll}, (members, rank, gaps)
        slots = Counter(round(t / poll) for ts in turns.values() for t in ts if t <= 1000.3 + 6 * poll)
        per_slot = -(-members // seats)  # more members than seats share them
        assert set(slots.values()) <= {per_slot, per_slot - 1} and max(slots.values()) == per_slot, slots


def test_a_turn_is_always_ahead() -> None:
    for now in (0.0, 1.9999, 2.0, 2.0001, 1e9 + 0.5):
        for members in (1, 2, 7):
            for rank in range(members):
                turn = next_wake_turn(now, 2.0, rank, members)
                assert now < turn <= now + min(members, WAKE_SHARE_MAX) * 2.0


async def _idle_group(store: MeteredStore, size: int, seconds: float) -> Counter[str]:
    b = Backend("memory", {"backend": "memory", "strategy": "conditional_write"}, store)
    bq = await b.connect(consumer=IDLE)
    await bq.create_topic("t", partitions=4)
    members = [await bq.register_consumer("c", "t") for _ in range(size)]
    try:
        await asyncio.sleep(1.5)  # idle, and every member sees the others
        before = _kinds(store)
        await asyncio.sleep(seconds)
        return _kinds(store) - before
    finally:
        for m in members:
            await m.close()
        await b.close_all()


@on_virtual_clock
async def test_an_idle_group_polls_the_wake_object_once_per_slot_not_once_per_member() -> None:
    one = await _idle_group(MeteredStore(MemoryStore()), 1, 2.0)
    three = await _idle_group(MeteredStore(MemoryStore()), 3, 2.0)
    # 2 s of 100 ms slots: ~20 polls whether one member or three share them (not ~60)
    assert 12 <= one["GET wake"] <= 24, one
    assert three["GET wake"] <= 1.3 * one["GET wake"] + 2, (one, three)


@on_virtual_clock
async def test_a_woken_member_claims_on_partitions_of_a_member_not_yet_awake() -> None:
    """The member whose turn sees the wake claims once on every partition of the topic, so a
    message on a partition whose owner sleeps until its turn (here: never) is not left waiting
    for it; the sleeping owner asks for no help, so only this sweep can take it."""
    store = MeteredStore(MemoryStore())
    b = Backend("memory", {"backend": "memory", "strategy": "conditional_write"}, store)
    bq = await b.connect(consumer=IDLE)
    await bq.create_topic("t", partitions=4)
    asleep = Membership(bq.storage, bq.keys, "t", "c", "zz-asleep", ttl_s=60)
    await asleep.heartbeat(ttl_s=60)
    producer = await bq.register_producer("p")
    awake = await bq.register_consumer("c", "t")
    try:
        await awake.poll(1, 1.0)
        await asyncio.sleep(1.0)  # idle, and the sleeping member counted (it owns some partitions)
        ours = owned_partitions(awake.member, ["zz-asleep", awake.member], 4, balanced=True)
        theirs = [p for p in range(4) if p not in ours]
        assert len(theirs) == 2, "two members, both announcing the balanced assignment: two each"
        started = time.monotonic()
        key = next(f"k{i}" for i in range(1000) if partition_for_key(f"k{i}", 4) == theirs[0])
        await producer.publish("t", "on a sleeping owner's partition", key=key)
        got = await awake.poll(1, 5.0)
        took = time.monotonic() - started
        assert [m.payload for m in got] == ["on a sleeping owner's partition"], took
        assert took < 1.5, f"picked up after {took:.2f}s (steal_after_s or the owner's turn, not the sweep)"
        await got[0].ack()
    finally:
        await awake.close()
        await b.close_all()


@on_virtual_clock
async def test_an_unchanged_heartbeat_keeps_its_etag_and_is_not_read_again() -> None:
    store = MeteredStore(MemoryStore())
    b = Backend("memory", {"backend": "memory", "strategy": "conditional_write"}, store)
    bq = await b.connect()
    quiet = Membership(bq.storage, bq.keys, "t", "g", "quiet", ttl_s=5.0)
    reader = Membership(bq.storage, bq.keys, "t", "g", "reader", ttl_s=5.0)
    await quiet.heartbeat(ttl_s=30)
    assert await reader.refresh() == ["quiet", "reader"]
    reads = _kinds(store)["GET member"]
    for _ in range(3):
        await quiet.heartbeat(ttl_s=30)
        assert await reader.refresh() == ["quiet", "reader"]
    assert _kinds(store)["GET member"] == reads  # same body, same ETag: LIST alone
    await quiet.heartbeat([2], ttl_s=30)  # asks for help: a new body, read once
    await reader.refresh()
    assert reader.help_wanted == {2}
    assert _kinds(store)["GET member"] == reads + 1
    await b.close_all()


@on_virtual_clock
async def test_status_counts_a_quiet_member_for_the_ttl_it_announced() -> None:
    b = Backend("memory", {"backend": "memory", "strategy": "conditional_write"}, MemoryStore())
    bq = await b.connect()
    await Membership(bq.storage, bq.keys, "t", "g", "quiet", ttl_s=1.0).heartbeat(ttl_s=2.0)
    await Membership(bq.storage, bq.keys, "t", "g", "plain", ttl_s=1.0).heartbeat()
    await asyncio.sleep(1.2)
    assert await live_members(bq.storage, bq.keys, "t", "g", member_ttl_s=1.0) == ["quiet"]
    await asyncio.sleep(1.0)
    assert await live_members(bq.storage, bq.keys, "t", "g", member_ttl_s=1.0) == []
    await b.close_all()


# -- heartbeats follow the messages, not the wake ------------------------------------------------


class _HeartbeatLog(MeteredStore):
    """Records when each member heartbeat landed and the TTL it announced (None: none)."""

    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.beats: list[tuple[float, float | None]] = []

    async def put(self, key: str, data: bytes, **kw):  # type: ignore[no-untyped-def, override]
        etag = await super().put(key, data, **kw)
        if key_kind(key) == "member":
            self.beats.append((time.monotonic(), json.loads(data).get("ttl")))
        return etag


async def _lone_message_then_quiet(store: _HeartbeatLog, quiet_s: float) -> None:
    """One member, busy on a stream of messages for a while, then a lone message after a silence,
    then ``quiet_s`` of nothing (the topic stays wake-active for WAKE_ACTIVE_S meanwhile)."""
    settings = {**IDLE, "heartbeat_interval_s": 0.2, "heartbeat_idle_s": 1.5, "member_ttl_s": 0.45}
    b = Backend("memory", {"backend": "memory", "strategy": "conditional_write"}, store)
    bq = await b.connect(consumer=settings)
    await bq.create_topic("t", partitions=2)
    producer = await bq.register_producer("p")
    member = await bq.register_consumer("c", "t")
    try:
        for i in range(10):  # busy: messages flow, heartbeats at the fast cadence
            await producer.publish("t", i)
            for m in await member.poll(10, 0.2):
                await m.ack()
        await asyncio.sleep(1.0)
        await producer.publish("t", "lone")
        got = await member.poll(1, 5.0)
        assert [m.payload for m in got] == ["lone"]
        await got[0].ack()
        store.beats.clear()
        await asyncio.sleep(quiet_s)
    finally:
        await b.close_all()


@on_virtual_clock
async def test_heartbeats_slow_down_once_messages_stop_although_a_wake_keeps_the_topic_active() -> None:
    """After a lone message the topic stays active for WAKE_ACTIVE_S (60 s: partitions polled in
    case the producer's next append comes before its next touch), but with no message for
    ``idle_after_s`` the member heartbeats at the idle cadence: 1.5 s here, not 0.2 s."""
    store = _HeartbeatLog(MemoryStore())
    await _lone_message_then_quiet(store, quiet_s=4.0)
    # at the fast cadence 4 s would hold about 20 heartbeats
    assert 1 <= len(store.beats) <= 5, store.beats


@on_virtual_clock
async def test_a_member_going_quiet_heartbeats_within_the_ttl_it_announced() -> None:
    """Invariant: each heartbeat lands within the TTL the one before it announced (peers never see
    a live member as gone), also when the cadence slows from 0.2 s (TTL 0.6 s) to 1.5 s."""
    store = _HeartbeatLog(MemoryStore())
    await _lone_message_then_quiet(store, quiet_s=4.0)
    beats = store.beats
    assert len(beats) >= 2, beats
    for (at, ttl), (nxt, _) in itertools.pairwise(beats):
        assert ttl is not None
        assert nxt - at <= ttl, f"a heartbeat {nxt - at:.2f}s after one that announced {ttl}s: {beats}"
