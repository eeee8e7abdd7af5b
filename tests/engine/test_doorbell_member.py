"""The doorbell, member side (core/pings.py, invariant I14): a member that owns a partition reads
the segment a ring names at once, through the normal read path; rings only move *when* it reads.

A producer and a member (two connections, one in-memory store) run on the virtual clock over a
loopback ping network that can drop, duplicate, delay and forge rings. Delivery is compared with
what was published (each message once, per partition in order) and the member's reads are
counted by the metered store.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from bucketq import Bucketq, Settings
from bucketq.bench.metered import MeteredStore
from bucketq.config import PROFILES, ConsumerSettings
from bucketq.core import cadence, topics
from bucketq.core.cadence import PING_LOOK_GAP_S, rung_poll_s
from bucketq.core.cursor_log import CursorLog
from bucketq.core.partition_worker import seen_op
from bucketq.core.pings import RING_VERSION, ring_payload
from bucketq.core.producer import partition_for_key
from bucketq.core.segment import decode_segment
from bucketq.errors import StorageError, TopicNotFound
from bucketq.storage import Blob, ObjectInfo
from bucketq.storage.memory import MemoryStore
from tests.support.virtual import run_virtual

Mode = Literal["deliver", "drop", "chaos"]


@dataclass
class Loopback:
    """The ping port between the connections of one test: ``deliver`` after a millisecond,
    ``drop`` every datagram, or ``chaos``: each one duplicated, the copies delayed out of order."""

    mode: Mode = "deliver"
    receivers: dict[str, Callable[[bytes], None]] = field(default_factory=dict)
    endpoints: int = 0

    def endpoint(self) -> Endpoint:
        self.endpoints += 1
        return Endpoint(self, f"udp://127.0.0.1:{7000 + self.endpoints}")

    def deliver(self, address: str, payload: bytes) -> None:
        receive = self.receivers.get(address)
        if receive is None or self.mode == "drop":
            return
        loop = asyncio.get_running_loop()
        if self.mode == "deliver":
            loop.call_later(0.001, receive, payload)
            return
        for delay in (0.03, 0.001, 0.2):  # late, early, and much later than the next one
            loop.call_later(delay, receive, payload)


@dataclass
class Endpoint:
    hub: Loopback
    address: str

    async def open(self, receive: Callable[[bytes], None]) -> str | None:
        self.hub.receivers[self.address] = receive
        return self.address

    def send(self, address: str, payload: bytes) -> None:
        self.hub.deliver(address, payload)

    def close(self) -> None:
        self.hub.receivers.pop(self.address, None)


class SlowStore:
    """An in-memory store whose every request takes ``request_s`` of (virtual) time, as a round trip
    to a real server does: a read that has to wait for another request shows in the latency."""

    def __init__(self, inner: MemoryStore, request_s: float) -> None:
        self.inner = inner
        self.request_s = request_s
        self.stats = inner.stats

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get(self, key: str) -> Blob | None:
        await asyncio.sleep(self.request_s)
        return await self.inner.get(key)

    async def head(self, key: str) -> ObjectInfo | None:
        await asyncio.sleep(self.request_s)
        return await self.inner.head(key)

    async def put(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        await asyncio.sleep(self.request_s)
        return await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    async def delete(self, keys: list[str]) -> None:
        await asyncio.sleep(self.request_s)
        await self.inner.delete(keys)

    async def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        await asyncio.sleep(self.request_s)
        async for info in self.inner.list(prefix, start_after=start_after):
            yield info


class FailingFirstGet(SlowStore):
    """The first GET of every segment fails (a 500 the client gave up on): the ring's read."""

    def __init__(self, inner: MemoryStore, request_s: float) -> None:
        super().__init__(inner, request_s)
        self.failed: set[str] = set()

    async def get(self, key: str) -> Blob | None:
        if "/seg/" in key and key not in self.failed and await self.inner.get(key) is not None:
            self.failed.add(key)
            await asyncio.sleep(self.request_s)
            raise StorageError(f"GET {key}: HTTP 500 InternalError")
        return await super().get(key)


def settings(consumer: dict[str, float] | None = None, profile: str = "balanced") -> Settings:
    return Settings.from_dict(
        {"backend": "memory", "strategy": "conditional_write", "profile": profile, "consumer": consumer or {}}
    )


@dataclass
class Run:
    received: list[tuple[int, int]]  # (partition, payload) in delivery order
    latencies: list[float]
    segment_gets: int
    segment_misses: int
    heartbeat: dict[str, Any]


async def one_at_a_time(
    mode: Mode,
    *,
    messages: int = 40,
    gap: float = 0.1,
    partitions: int = 1,
    forge: int = 0,
    consumer_settings: dict[str, float] | None = None,
    gaps: Sequence[float] = (),
    request_s: float = 0.0,
    profile: str = "balanced",
    fail_first_segment_get: bool = False,
) -> Run:
    """Publish ``messages`` one at a time, each ``gap`` after the last arrived (or the next of
    ``gaps``, in turn; each publish awaited: a closed loop, no linger) while a member listens;
    ``forge`` forged rings for the next, unwritten segment of partition 0 are sent to the member
    per publish. Every store request takes ``request_s``."""
    hub = Loopback(mode)
    slow = (
        FailingFirstGet(MemoryStore(), request_s)
        if fail_first_segment_get
        else SlowStore(MemoryStore(), request_s)
    )
    store = MeteredStore(slow)
    producer_bq = Bucketq(settings(profile=profile), store=store, ping_network=hub.endpoint())
    member_bq = Bucketq(settings(consumer_settings, profile), store=store, ping_network=hub.endpoint())
    await producer_bq.open()
    await member_bq.open()
    await producer_bq.create_topic("t", partitions=partitions)
    consumer = await member_bq.register_consumer("g", "t")
    producer = await producer_bq.register_producer("p")
    await asyncio.sleep(2.0)  # the member settles into its polling (its first looks found nothing)
    beat = await store.inner.get(member_bq.keys.member("t", "g", consumer.member))
    assert beat is not None
    heartbeat = json.loads(beat.data)
    received: list[tuple[int, int]] = []
    latencies: list[float] = []
    sent_at: dict[int, float] = {}
    loop = asyncio.get_running_loop()
    got = asyncio.Event()

    async def handler(msg: Any) -> None:
        n = int(msg.payload)
        received.append((msg.partition, n))
        latencies.append(loop.time() - sent_at[n])
        got.set()

    stop = asyncio.Event()
    listening = loop.create_task(consumer.listen(handler, stop=stop))
    before = dict(store.calls)
    wake_key = member_bq.keys.wake("t")
    for n in range(messages):
        got.clear()
        sent_at[n] = loop.time()
        result = await producer.publish("t", n, key=f"k{n}")
        for _ in range(forge):
            hub.deliver(consumer.pings.address or "", ring_payload(wake_key, 0, result.seq + 1000 + n))
        await asyncio.wait_for(got.wait(), timeout=600)
        await asyncio.sleep(gaps[n % len(gaps)] if gaps else gap)
    segment_gets = store.calls["GET segment"] - before.get("GET segment", 0)
    misses = store.calls["GET segment miss"] - before.get("GET segment miss", 0)
    stop.set()
    await listening
    await consumer.close()
    await producer_bq.close()
    await member_bq.close()
    return Run(received, latencies, segment_gets, misses, heartbeat)


def assert_each_once_in_order(run: Run, messages: int) -> None:
    assert sorted(n for _, n in run.received) == list(range(messages))
    by_partition: dict[int, list[int]] = {}
    for p, n in run.received:
        by_partition.setdefault(p, []).append(n)
    assert all(ns == sorted(ns) for ns in by_partition.values())


def test_a_member_that_reads_rings_says_so_in_its_heartbeat() -> None:
    run = run_virtual(lambda: one_at_a_time("deliver", messages=1))
    assert run.heartbeat["ping"] == RING_VERSION
    assert run.heartbeat["wake"].startswith("udp://127.0.0.1:")


def test_a_ring_is_answered_by_reading_exactly_the_named_segment() -> None:
    """Each message is seen one read after it is durable: one GET of its segment, no 404 probe
    after it, and the fallback polling slowed down (the rings prove the path works)."""
    rung = run_virtual(lambda: one_at_a_time("deliver"))
    polled = run_virtual(lambda: one_at_a_time("drop"))
    assert_each_once_in_order(rung, 40)
    assert_each_once_in_order(polled, 40)
    assert max(rung.latencies) < 0.01  # the ring's millisecond, then reads at virtual speed
    assert sorted(polled.latencies)[20] > 0.02  # polling waits for its next look
    assert rung.segment_gets == 40
    # without rings the paced stream is found by polling: a look or more that finds nothing per
    # message; with them, the slow fallback poll only (4 s of stream, a 5 s rung poll)
    assert polled.segment_misses >= 40
    assert rung.segment_misses <= 2


@pytest.mark.parametrize("partitions", [1, 3])
def test_duplicated_reordered_rings_deliver_each_message_once(partitions: int) -> None:
    run = run_virtual(lambda: one_at_a_time("chaos", partitions=partitions, gap=0.02))
    assert_each_once_in_order(run, 40)
    assert run.segment_gets == 40  # a duplicate or a late ring for a segment already read: no GET


def test_without_rings_delivery_falls_back_to_polling_with_nothing_lost() -> None:
    run = run_virtual(lambda: one_at_a_time("drop", gap=0.3))
    assert_each_once_in_order(run, 40)
    assert max(run.latencies) <= 0.25  # the active poll (poll_max 100 ms), never a wake poll


def test_a_flood_of_forged_rings_costs_at_most_one_look_a_second() -> None:
    """A forger names a segment that does not exist, 200 times per message: a look that does not
    find the segment a ring named makes the next ring look wait PING_LOOK_GAP_S (as pings'
    looks do), so the flood costs at most one GET that finds nothing a second, and delays a
    pickup by that gap at most; every message is still delivered once."""
    messages, gap = 20, 0.25
    run = run_virtual(lambda: one_at_a_time("deliver", messages=messages, gap=gap, forge=200))
    assert_each_once_in_order(run, messages)
    seconds = sum(run.latencies) + messages * gap
    # one forged look per gap, and the fallback poll (slow: the real rings kept finding segments)
    assert run.segment_misses <= seconds / PING_LOOK_GAP_S + seconds / rung_poll_s(settings().consumer) + 2
    assert run.segment_gets == messages
    assert max(run.latencies) <= PING_LOOK_GAP_S + 0.01


def test_a_ring_brings_each_message_at_once_however_slow_the_polls() -> None:
    """Polls a minute apart on an active topic: only the rings bring the messages, each at once
    (ring looks wait a quarter second at most after the last, whatever poll_max_ms says)."""
    slow = {"poll_min_ms": 60_000, "poll_max_ms": 60_000, "idle_after_s": 3600, "commit_linger_ms": 0}
    run = run_virtual(
        lambda: one_at_a_time("deliver", messages=6, partitions=2, gap=0.5, consumer_settings=slow)
    )
    assert_each_once_in_order(run, 6)
    assert max(run.latencies) < 0.01


# moto's round trip on this machine: the three requests on a message's way (its segment's PUT,
# the member's GET, the claim delta) are most of the one-at-a-time latency (docs/benchmarks.md)
REQUEST_S = 0.007


@pytest.mark.parametrize(
    ("profile", "gaps"),
    [
        # a steady stream: the ring comes when the partition's tail poll is due (the poll's look
        # past the named segment, a 404, used to stand between the segment and its claim)
        ("latency", (0.05,)),
        ("balanced", (0.05,)),
        # gaps that alternate: an ack lingering for the next claim runs out (the next message
        # comes 93 ms after the last) and its own delta is in flight when the ring arrives (the
        # ring's read used to wait for it, and for the loop's tick)
        ("latency", (0.01, 0.093)),
    ],
)
def test_a_ringing_message_reaches_its_handler_after_three_requests(
    profile: str, gaps: tuple[float, ...]
) -> None:
    """One message at a time, every request 7 ms: each message reaches its handler within its
    three requests (the segment's PUT, the member's GET, the claim delta) and the ring's
    millisecond. Nothing else stands on its way: not a look past the named segment, not an ack
    delta or the loop's other work in progress (the ack waits, not the claim). The first message
    is left out: it wakes the idle topic (the producer touches the wake object first)."""
    run = run_virtual(
        lambda: one_at_a_time("deliver", messages=20, gaps=gaps, request_s=REQUEST_S, profile=profile)
    )
    assert_each_once_in_order(run, 20)
    floor = 3 * REQUEST_S + 0.001
    late = [round(t * 1000, 1) for t in run.latencies[1:] if t > floor + 0.0005]
    assert not late, f"latencies over the {floor * 1000:g} ms floor (ms): {late}"


def test_a_failed_read_ahead_fails_the_look_it_serves_and_loses_nothing() -> None:
    """Every segment's first GET (the one a ring starts at once) fails: the ring's look fails as
    its own GET would have, the member's loop retries after its rest, and every message is still
    delivered once and in order, within the retry and the rung poll."""
    run = run_virtual(
        lambda: one_at_a_time(
            "deliver",
            messages=10,
            gaps=(0.01, 0.093),
            request_s=REQUEST_S,
            profile="latency",
            fail_first_segment_get=True,
        )
    )
    assert_each_once_in_order(run, 10)
    rung_poll = rung_poll_s(ConsumerSettings(**PROFILES["latency"]["consumer"]))
    assert max(run.latencies[1:]) <= rung_poll + 0.1


def keys_for(partition: int, partitions: int, count: int) -> list[str]:
    """``count`` keys that hash to ``partition`` of ``partitions``."""
    found = (f"k{i}" for i in range(10_000))
    return [k for k in found if partition_for_key(k, partitions) == partition][:count]


async def rung_topic_with_a_silent_producer(stream_s: float, quiet_at: float) -> tuple[int, float]:
    """A ringing producer streams on partition 0 of 4 (every 0.1 s for ``stream_s``); a second
    producer that cannot ring (pings disabled: another network, an older release) publishes one
    message on partition 1 ``quiet_at`` seconds in. Returns (segment GETs that found nothing
    during the stream, the silent producer's message's latency)."""
    hub = Loopback("deliver")
    store = MeteredStore(MemoryStore())
    ringing = Bucketq(settings(), store=store, ping_network=hub.endpoint())
    silent = Bucketq(
        Settings.from_dict(
            {"backend": "memory", "strategy": "conditional_write", "ping": {"enabled": False}}
        ),
        store=store,
    )
    member_bq = Bucketq(settings(), store=store, ping_network=hub.endpoint())
    for bq in (ringing, silent, member_bq):
        await bq.open()
    await ringing.create_topic("t", partitions=4)
    consumer = await member_bq.register_consumer("g", "t")
    loud = await ringing.register_producer("loud")
    quiet = await silent.register_producer("quiet")
    await asyncio.sleep(2.0)
    loop = asyncio.get_running_loop()
    arrived: dict[str, float] = {}

    async def handler(msg: Any) -> None:
        arrived[str(msg.payload)] = loop.time()

    stop = asyncio.Event()
    listening = loop.create_task(consumer.listen(handler, stop=stop))
    before = store.calls["GET segment miss"]
    started = loop.time()
    sent_quiet = -1.0
    steps = int(stream_s / 0.1)
    for n, key in enumerate(keys_for(0, 4, steps)):
        await loop.create_task(loud.publish("t", f"loud{n}", key=key))
        if sent_quiet < 0 and loop.time() - started >= quiet_at:
            sent_quiet = loop.time()
            await quiet.publish("t", "quiet", key=keys_for(1, 4, 1)[0])
        await asyncio.sleep(0.1)
    misses = store.calls["GET segment miss"] - before
    while "quiet" not in arrived:
        await asyncio.sleep(0.1)
    assert all(f"loud{n}" in arrived for n in range(steps))
    stop.set()
    await listening
    await consumer.close()
    for bq in (ringing, silent, member_bq):
        await bq.close()
    return misses, arrived["quiet"] - sent_quiet


def test_partitions_no_ring_reaches_slow_to_a_wake_poll_and_a_silent_producer_is_read_within_it() -> None:
    """Rings reaching one partition prove the producers' path to the member: the partitions no
    ring reaches are then polled towards a wake poll at once (not every poll_max_ms for
    idle_after_s), and a producer that cannot ring is still read within a wake poll (the bound,
    cadence.discovery_after_miss)."""
    misses, latency = run_virtual(lambda: rung_topic_with_a_silent_producer(stream_s=8.0, quiet_at=1.0))
    wake = rung_poll_s(settings().consumer)
    assert latency <= wake + 0.2
    # each of the 4 partitions: the doubling from poll_min to a wake poll (10 looks), then a look
    # per wake poll; at the active cadence the 3 partitions nobody rings cost 8 s / 0.1 s each
    assert misses <= 4 * (10 + 8.0 / wake + 2)


async def latency_profile_stream(messages: int, gap: float) -> tuple[int, int, list[float]]:
    """The latency profile, a stream of one-message segments ``gap`` apart on one partition, a
    member polling and acking each batch while the next poll waits (the bench's consumer).
    Returns (cursor deltas written, messages acked, each ack's wait)."""
    hub = Loopback("deliver")
    store = MeteredStore(MemoryStore())
    latency = {"backend": "memory", "strategy": "conditional_write", "profile": "latency"}
    producer_bq = Bucketq(Settings.from_dict(latency), store=store, ping_network=hub.endpoint())
    member_bq = Bucketq(Settings.from_dict(latency), store=store, ping_network=hub.endpoint())
    await producer_bq.open()
    await member_bq.open()
    await producer_bq.create_topic("t", partitions=1)
    consumer = await member_bq.register_consumer("g", "t")
    producer = await producer_bq.register_producer("p")
    await asyncio.sleep(2.0)
    loop = asyncio.get_running_loop()
    ack_waits: list[float] = []
    acks: set[asyncio.Task[None]] = set()

    async def ack(msg: Any) -> None:
        started = loop.time()
        await msg.ack()
        ack_waits.append(loop.time() - started)

    async def consume() -> None:
        received = 0
        while received < messages:
            for msg in await consumer.poll(max_messages=100, wait=0.1):
                received += 1
                task = loop.create_task(ack(msg))
                acks.add(task)
                task.add_done_callback(acks.discard)

    consuming = loop.create_task(consume())
    before = consumer.counters.commits
    publishes = []
    for n in range(messages):
        publishes.append(loop.create_task(producer.publish("t", n)))
        await asyncio.sleep(gap)
    await asyncio.gather(*publishes)
    await consuming
    while acks:
        await asyncio.sleep(0.01)
    deltas = consumer.counters.commits - before
    await consumer.close()
    await producer_bq.close()
    await member_bq.close()
    return deltas, len(ack_waits), ack_waits


def test_a_paced_stream_under_a_standing_claim_costs_a_cursor_write_per_linger_not_per_segment() -> None:
    """Each message its own segment, 80 ms apart (50 msg/s over 4 producers). The owner takes a
    standing claim with its first claim delta (I20); from then on it hands each segment's message
    out with no claim write, and one delta per standing linger writes the segments' ``seen``, the
    acks and the renewal. An ack waits for that delta at most the standing linger (it returns only
    once durable). Before standing claims: a claim delta per segment (about 50)."""
    deltas, acked, waits = run_virtual(lambda: latency_profile_stream(messages=50, gap=0.08))
    assert acked == 50
    linger = cadence.standing_linger(ConsumerSettings(**PROFILES["latency"]["consumer"]))
    assert deltas <= 50 * 0.08 / linger + 3, f"{deltas} cursor deltas for 50 one-message segments"
    assert max(waits) <= linger + 0.05


async def standing_claim_handover() -> tuple[bool, bool, float]:
    """A member reads a stream under a standing claim (I20), then closes; another member joins
    and a message is published. Returns (a standing claim stood while the stream flowed, none
    stands after the close, seconds until the second member received the new message)."""
    hub = Loopback("deliver")
    store = MemoryStore()
    latency = {"backend": "memory", "strategy": "conditional_write", "profile": "latency"}
    producer_bq = Bucketq(Settings.from_dict(latency), store=store, ping_network=hub.endpoint())
    first_bq = Bucketq(Settings.from_dict(latency), store=store, ping_network=hub.endpoint())
    second_bq = Bucketq(Settings.from_dict(latency), store=store, ping_network=hub.endpoint())
    for bq in (producer_bq, first_bq, second_bq):
        await bq.open()
    await producer_bq.create_topic("t", partitions=1)
    first = await first_bq.register_consumer("g", "t")
    producer = await producer_bq.register_producer("p")
    await asyncio.sleep(2.0)
    got = 0
    for n in range(10):
        await producer.publish("t", n)
        for msg in await first.poll(max_messages=10, wait=1.0):
            await msg.ack()
            got += 1
        await asyncio.sleep(0.08)
    while got < 10:
        for msg in await first.poll(max_messages=10, wait=1.0):
            await msg.ack()
            got += 1
    worker = first._subs["t"].workers[0]
    stood = worker.standing() is not None
    await first.close()
    second = await second_bq.register_consumer("g", "t")
    await second._subs["t"].workers[0].log.catch_up()
    given_back = second._subs["t"].workers[0].state.standing is None
    loop = asyncio.get_running_loop()
    started = loop.time()
    await producer.publish("t", "after")
    received: list[Any] = []
    while not received and loop.time() - started < 120:
        received = await second.poll(max_messages=1, wait=1.0)
    took = loop.time() - started
    await second.close()
    await producer_bq.close()
    for bq in (first_bq, second_bq):
        await bq.close()
    return stood, given_back, took


def test_a_closing_member_gives_its_standing_claim_back_and_the_next_one_delivers_at_once() -> None:
    """I20: a member that closes writes the end of its standing claim with its last delta, so the
    member that follows it takes the partition over at once, not once the claim ran out (a
    visibility timeout, 30 s here, plus the clock-skew margin)."""
    stood, given_back, took = run_virtual(standing_claim_handover)
    assert stood, "no standing claim while the stream flowed"
    assert given_back, "the standing claim was left standing after close()"
    assert took < 5.0, f"the next member waited {took:.1f}s for the first message"


async def dead_letters_under_a_standing_claim(
    messages: int,
) -> tuple[bool, list[str], dict[int, int], list[Any]]:
    """A stream read under a standing claim (I20) whose app dead-letters every other message (a
    push app's DROP) the moment it gets it, before the delta with the segment's ``seen`` is
    written. Returns (a standing claim stood, the errors the app's settlements raised, how often
    each message was delivered, the dead-letter topic's messages)."""
    hub = Loopback("deliver")
    store = MemoryStore()
    latency = {"backend": "memory", "strategy": "conditional_write", "profile": "latency"}
    producer_bq = Bucketq(Settings.from_dict(latency), store=store, ping_network=hub.endpoint())
    member_bq = Bucketq(Settings.from_dict(latency), store=store, ping_network=hub.endpoint())
    await producer_bq.open()
    await member_bq.open()
    await producer_bq.create_topic("t", partitions=1)
    member = await member_bq.register_consumer("g", "t")
    producer = await producer_bq.register_producer("p")
    await asyncio.sleep(2.0)
    loop = asyncio.get_running_loop()
    deliveries: dict[int, int] = {}
    errors: list[str] = []
    stood = False

    async def settle(msg: Any) -> None:
        try:
            if msg.payload % 2:
                await msg.dead_letter("dropped by the app")
            else:
                await msg.ack()
        except Exception as exc:  # the finding: a LeaseLost for a message the member holds
            errors.append(f"{msg.payload}: {exc!r}")

    async def consume(until: float) -> None:
        nonlocal stood
        settling: list[asyncio.Task[None]] = []
        while loop.time() < until:
            for msg in await member.poll(max_messages=10, wait=0.2):
                deliveries[msg.payload] = deliveries.get(msg.payload, 0) + 1
                stood = stood or member._subs["t"].workers[0].standing() is not None
                settling.append(loop.create_task(settle(msg)))
        await asyncio.gather(*settling)

    # past the visibility timeout (30 s): a settlement that did not hold would deliver it again
    consuming = loop.create_task(consume(loop.time() + messages * 0.08 + 45.0))
    for n in range(messages):
        await producer.publish("t", n)
        await asyncio.sleep(0.08)
    await consuming
    await member.close()
    dlq = await member_bq.register_consumer("inspect", "t.dlq")
    dead: list[Any] = []
    for _ in range(5):
        dead += await dlq.poll(max_messages=messages, wait=1.0)
    await dlq.close()
    await producer_bq.close()
    await member_bq.close()
    return stood, errors, deliveries, [m.payload for m in dead]


def test_a_message_dead_lettered_under_a_standing_claim_is_never_delivered_again() -> None:
    """I20: a message handed out under a standing claim is leased to its holder from the hand-out;
    the app may dead-letter it (a push app's DROP) before the delta that writes its segment's
    ``seen``, and the settlement then rides in that delta after the ``seen``, exactly like an ack.
    It used to be refused as a lost lease (the member looked for the lease in the log only), so
    the message came back once the standing claim's lease ran out."""
    stood, errors, deliveries, dead = run_virtual(lambda: dead_letters_under_a_standing_claim(20))
    assert stood, "no standing claim while the stream flowed: the test did not test it"
    assert errors == []
    assert deliveries == dict.fromkeys(range(20), 1)
    assert sorted(dead) == list(range(1, 20, 2))


@dataclass
class CoveredBySomeoneElse:
    """A member (``max_in_flight=1``) holding ``first`` under the standing claim it took (I20),
    and a second message whose segment another member (one that also believes it owns the
    partition: membership views may differ for a heartbeat) saw, which leased it to that claim."""

    member_bq: Bucketq
    other_bq: Bucketq
    member: Any
    first: Any
    stood: bool  # a standing claim stood: else the tests below test nothing

    async def close(self) -> None:
        await self.member_bq.close()
        await self.other_bq.close()


async def a_segment_seen_by_another_member_under_a_standing_claim() -> CoveredBySomeoneElse:
    store = MemoryStore()
    member_bq = Bucketq(settings(), store=store)
    other_bq = Bucketq(settings(), store=store)
    await member_bq.open()
    await other_bq.open()
    await other_bq.create_topic("t", partitions=1)
    member = await member_bq.register_consumer("g", "t", max_in_flight=1)
    producer = await other_bq.register_producer("p")
    await producer.publish("t", "first")
    [first] = await member.poll(max_messages=1, wait=10.0)
    stood = member._subs["t"].workers[0].standing() is not None

    await producer.publish("t", "second")  # the member is full: it does not look for it
    incarnation = (await other_bq.catalog.marker("t")).incarnation
    other = CursorLog(
        other_bq.storage,
        other_bq.keys,
        "t",
        "g",
        0,
        "other",
        topic_fence=other_bq.catalog.fence("t", incarnation),
    )
    state = await other.load()
    blob = await other_bq.storage.get(other_bq.keys.segment("t", 0, state.frontier + 1))
    assert blob is not None
    await other.commit(lambda s: [seen_op(decode_segment(blob.data), "g", incarnation)])
    return CoveredBySomeoneElse(member_bq, other_bq, member, first, stood)


async def covered_segment_seen_by_another_member() -> tuple[bool, str | None, float]:
    """The holder of ``a_segment_seen_by_another_member_under_a_standing_claim`` acks the first
    message (its delta meets the other's, rebases and lands). Returns (a standing claim stood, the
    payload the holder received next, seconds until it did)."""
    case = await a_segment_seen_by_another_member_under_a_standing_claim()
    await case.first.ack()
    loop = asyncio.get_running_loop()
    started = loop.time()
    received: list[Any] = []
    while not received and loop.time() - started < 120:
        received = await case.member.poll(max_messages=1, wait=1.0)
    took = loop.time() - started
    await case.member.close()
    await case.close()
    return case.stood, received[0].payload if received else None, took


def test_a_message_another_member_saw_under_this_members_standing_claim_is_delivered_at_once() -> None:
    """I20: a ``seen`` written by any member leases a covered segment's messages to the standing
    claim's holder. The holder hands them out whenever its replica shows them, not only after a
    delta of its own: here it read the other's ``seen`` while committing its ack, before the
    segment was in its window, and then had nothing to write, so the message sat leased to it,
    undelivered, until the lease ran out (a visibility timeout, 30 s)."""
    stood, payload, took = run_virtual(covered_segment_seen_by_another_member)
    assert stood, "no standing claim: the test did not test it"
    assert payload == "second"
    assert took < 5.0, f"the message leased to the holder reached its app after {took:.1f}s"


async def standing_claim_given_back_over_a_covered_segment() -> tuple[bool, list[str], float]:
    """The holder of ``a_segment_seen_by_another_member_under_a_standing_claim`` closes (giving the
    first message and the claim back) without having read the log since. A new member joins.
    Returns (a standing claim stood, what the new member received, seconds until it had both)."""
    case = await a_segment_seen_by_another_member_under_a_standing_claim()
    await case.member.close()  # gives "first" back (drain) and ends the standing claim
    await case.member_bq.close()
    successor = await case.other_bq.register_consumer("g", "t")
    loop = asyncio.get_running_loop()
    started = loop.time()
    received: list[str] = []
    while len(received) < 2 and loop.time() - started < 120:
        for msg in await successor.poll(max_messages=10, wait=1.0):
            received.append(msg.payload)
            await msg.ack()
    took = loop.time() - started
    await successor.close()
    await case.other_bq.close()
    return case.stood, received, took


def test_a_standing_claim_given_back_releases_the_covered_messages_its_holder_never_handed_out() -> None:
    """I20: the end of a standing claim (its holder closes, or stops owning the partition) also
    releases what the log leases to it that it never handed out: here a segment another member saw
    under it. Those leases used to outlive the claim, so the message waited for its lease to run
    out (a visibility timeout) before anybody could claim it."""
    stood, received, took = run_virtual(standing_claim_given_back_over_a_covered_segment)
    assert stood, "no standing claim: the test did not test it"
    assert sorted(received) == ["first", "second"]
    assert took < 5.0, f"the successor waited {took:.1f}s"


async def close_after_the_topic_was_deleted() -> tuple[bool, float]:
    """A member holds a standing claim (I20) when its topic is deleted; it is told so, then
    closes. Returns (a standing claim stood, seconds ``close()`` took)."""
    store = MemoryStore()
    member_bq = Bucketq(settings({"heartbeat_interval_s": 0.2}), store=store)
    admin_bq = Bucketq(settings(), store=store)
    await member_bq.open()
    await admin_bq.open()
    await admin_bq.create_topic("t", partitions=1)
    member = await member_bq.register_consumer("g", "t")
    producer = await admin_bq.register_producer("p")
    await producer.publish("t", "only")
    [msg] = await member.poll(max_messages=1, wait=10.0)
    await msg.ack()
    stood = member._subs["t"].workers[0].standing() is not None
    await admin_bq.catalog.delete("t", fence_wait_s=DELETE_FENCE_WAIT_S)
    told = False
    for _ in range(600):  # until a refresh of the topic's marker finds it gone
        try:
            await member.poll(max_messages=1, wait=1.0)
        except TopicNotFound:
            told = True
            break
    assert told, "the member was never told its topic was deleted"
    loop = asyncio.get_running_loop()
    started = loop.time()
    await member.close()
    took = loop.time() - started
    await member_bq.close()
    await admin_bq.close()
    return stood, took


DELETE_FENCE_WAIT_S = 1.0


def test_a_member_whose_topic_was_deleted_closes_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing can be written to a deleted topic's cursor logs (I6), so ``close()`` does not wait
    for them: it used to wait its whole 10 s budget for the give-back of a standing claim (I20)
    that could never be written."""
    monkeypatch.setattr(topics, "TOPIC_FENCE_S", DELETE_FENCE_WAIT_S / 2)
    stood, took = run_virtual(close_after_the_topic_was_deleted)
    assert stood, "no standing claim: the test did not test it"
    assert took < 1.0, f"close() took {took:.1f}s"
