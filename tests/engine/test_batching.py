"""Group commit without a fixed wait (core/batching.py): when a batch lingers, and for how long.

The decisions are pure functions of arrival times, checked here on explicit clocks; the engine
tests below check that the producer and the consumer follow them (memory store, no timing bounds
tighter than a linger of seconds).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, deque
from typing import Any

import pytest

from bucketq.bench.metered import MeteredStore
from bucketq.bench.served import ServedStore
from bucketq.config import PROFILES, ProducerSettings
from bucketq.core.batching import AT_ONCE, PROBE_EVERY_S, SILENCE_GAPS, Batcher, Callers
from bucketq.storage.memory import MemoryStore
from tests.support.engine_helpers import Backend
from tests.support.virtual import run_virtual
from tests.support.virtual_tests import on_virtual_clock

WRITE_S = 0.005  # what one write takes in these clocks


def _stream(
    batcher: Batcher,
    gap_s: float,
    count: int,
    start: float = 100.0,
    waits: list[float] | None = None,
    times: list[float] | None = None,
    write_s: float = WRITE_S,
) -> list[int]:
    """Feed ``count`` arrivals ``gap_s`` apart (or at ``times``) to a writer that writes one batch
    at a time (each write takes ``write_s``) when ``close_at`` says so; returns the sizes of the
    batches written and appends to ``waits`` how long each batch's last item waited for its write
    to start."""
    arrivals = deque(sorted(times) if times is not None else (start + i * gap_s for i in range(count)))
    sizes: list[int] = []
    open_items = 0
    write_end: float | None = None
    now = start
    while arrivals or open_items or write_end is not None:
        events: list[tuple[float, int, str]] = []  # (time, tie order, kind)
        if write_end is not None:
            events.append((write_end, 0, "end"))
        elif open_items:
            events.append((max(now, batcher.close_at(now, open_items)), 2, "write"))
        if arrivals:
            events.append((arrivals[0], 1, "arrive"))
        now, _, kind = min(events)
        if kind == "arrive":
            arrivals.popleft()
            batcher.arrived(now)
            open_items += 1
        elif kind == "end":
            write_end = None
            if not open_items:
                batcher.idle(now)
        else:
            batcher.taken()
            if waits is not None and batcher.last_at is not None:
                waits.append(now - batcher.last_at)
            sizes.append(open_items)
            open_items = 0
            write_end = now + write_s
    return sizes


def test_nothing_lingers_without_evidence_of_a_stream() -> None:
    batcher = Batcher(0.3)
    batcher.arrived(10.0)
    assert batcher.close_at(10.0) == AT_ONCE


def test_a_zero_linger_never_waits() -> None:
    batcher = Batcher(0.0)
    for t in range(50):
        batcher.arrived(10.0 + t * 0.001)
    assert batcher.close_at(10.05) == AT_ONCE


def test_one_caller_awaiting_each_call_is_written_at_once() -> None:
    """A closed loop of one: each arrival comes after the previous write ended, never while busy.
    Only a probe (at most one per PROBE_EVERY_S) waits, and only a couple of gaps."""
    batcher = Batcher(0.3)
    now = start = 10.0
    probes = 0
    for _ in range(400):
        batcher.arrived(now)
        due = batcher.close_at(now)
        if due != AT_ONCE:
            probes += 1
            assert due - now <= 3 * (WRITE_S + 0.0001)
            now = due
        batcher.taken()
        now += WRITE_S
        batcher.idle(now)
        now += 0.0001  # the caller publishes again right away
    assert probes <= (now - start) / PROBE_EVERY_S + 1
    assert batcher.rate(now) == 0.0


def test_an_open_loop_stream_lingers_and_fills_batches() -> None:
    """12.5 arrivals/s (50 msg/s over 4 producers): written in batches of about linger x rate."""
    sizes = _stream(Batcher(0.3), gap_s=0.08, count=400)
    assert sum(sizes) == 400
    steady = sizes[len(sizes) // 2 :]
    assert min(steady) >= 3 and sum(steady) / len(steady) >= 3.5, sizes


def test_a_paced_batch_is_written_with_its_last_item_not_at_the_linger() -> None:
    """Arrivals 80 ms apart, a 300 ms linger: the fifth item would come at 320 ms, after the
    deadline, so the batch of four is written as the fourth arrives instead of idling 60 ms."""
    waits: list[float] = []
    sizes = _stream(Batcher(0.3), gap_s=0.08, count=400, waits=waits)
    steady = slice(len(sizes) // 2, -1)  # the stream's last batch is what remains of it
    assert min(sizes[steady]) >= 4, sizes
    assert max(waits[steady]) < 0.001, waits


def test_a_batch_stops_lingering_once_full_enough() -> None:
    """1,000 arrivals/s with a 300 ms linger: without a fill, batches of about 300; with
    ``fill=32``, each is written once 32 wait (plus what arrived during the write before)."""
    unbounded = _stream(Batcher(0.3), gap_s=0.001, count=3000)
    filled = _stream(Batcher(0.3, fill=32), gap_s=0.001, count=3000)
    assert sum(filled) == 3000
    assert max(unbounded[len(unbounded) // 2 :]) >= 250, unbounded
    steady = filled[len(filled) // 2 : -1]
    assert min(steady) >= 32 and max(steady) <= 32 + 1 + round(WRITE_S / 0.001), filled


def test_a_fill_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="fill"):
        Batcher(0.3, fill=0)


def test_a_slow_stream_is_not_held_back() -> None:
    """One arrival every 2 s: not even one more expected within the linger, so no waiting."""
    sizes = _stream(Batcher(0.3), gap_s=2.0, count=30)
    assert sizes == [1] * 30


def test_a_burst_closes_after_a_short_silence() -> None:
    """Eight callers that each await their call arrive together, then all wait: the batch closes
    a few gaps after the burst, not at the linger."""
    batcher = Batcher(0.3)
    now = 10.0
    for _ in range(50):  # rounds: 8 arrivals 50 µs apart, a write, again
        for k in range(8):
            batcher.arrived(now + k * 0.00005)
        last = now + 7 * 0.00005
        due = batcher.close_at(last)
        assert due == AT_ONCE or due - last <= 0.003
        batcher.taken()
        now = max(due, last) + WRITE_S
        batcher.idle(now)
        now += 0.0001


def test_a_closed_loop_burst_closes_a_couple_of_its_own_gaps_after_it_ends() -> None:
    """The silence is measured in the gaps between a batch's arrivals (50 µs in the burst), not in
    busy time over arrivals (a 5 ms write over 7 arrivals, which held each burst 1.5 ms)."""
    batcher = Batcher(0.3)
    now = 10.0
    waits = []
    for _ in range(50):
        for k in range(8):
            batcher.arrived(now + k * 0.00005)
        last = now + 7 * 0.00005
        due = batcher.close_at(last, 8)
        waits.append(0.0 if due == AT_ONCE else due - last)
        batcher.taken()
        now = max(due, last) + WRITE_S
        batcher.idle(now)
        now += 0.0001
    assert max(waits[10:]) <= SILENCE_GAPS * 0.00005 + 1e-9, waits


def test_a_paced_stream_whose_publishes_start_in_bunches_keeps_its_batches() -> None:
    """125 arrivals/s whose publishes start late, a few at once, after random stalls of up to
    10 ms (an event loop busy with responses), written in 10 ms. Their gaps inside a batch are
    then mostly zero, but they are no burst of callers that all wait: the silence stays at the
    mean gap, and the batches fill up (measuring it in those gaps closed each one after a bunch:
    2 per batch)."""
    rng = random.Random(1)
    times: list[float] = []
    released = 0.0
    for due in (100.0 + i * 0.008 for i in range(3000)):
        if due >= released:
            released = due + rng.uniform(0.0, 0.010)
        times.append(max(due, released))
    sizes = _stream(Batcher(0.35, fill=32), 0.0, 0, times=times, write_s=0.010)
    steady = sizes[len(sizes) // 2 :]
    assert sum(sizes) == 3000
    assert sum(steady) / len(steady) >= 15, steady


def test_the_estimate_follows_the_load_down() -> None:
    batcher = Batcher(0.3)
    _stream(batcher, gap_s=0.01, count=300, start=10.0)
    assert batcher.rate(13.1) > 10
    batcher.arrived(60.0)  # a minute later: the stream is long gone
    assert batcher.close_at(60.0) == AT_ONCE


# -- the engine follows them ---------------------------------------------------------------------


def _backend() -> Backend:
    return Backend("memory", {"backend": "memory", "strategy": "conditional_write"}, MemoryStore())


@pytest.mark.parametrize("tasks", [1, 8])
async def test_awaited_publishes_are_never_held_by_the_linger(tasks: int) -> None:
    """A closed loop of ``tasks`` callers with a 5 s linger: each publish returns in far less."""
    b = _backend()
    bq = await b.connect(producer={"linger_ms": 5000})
    await bq.create_topic("t", partitions=1)
    producer = await bq.register_producer("p")
    slowest = 0.0

    async def caller(n: int) -> None:
        nonlocal slowest
        for i in range(25):
            started = time.monotonic()
            await producer.publish("t", f"{n}-{i}")
            slowest = max(slowest, time.monotonic() - started)

    await asyncio.gather(*(caller(n) for n in range(tasks)))
    await b.close_all()
    assert slowest < 2.5, f"an awaited publish waited {slowest:.2f}s: the linger held a closed loop"


async def test_awaiting_callers_that_started_as_two_cohorts_share_one_segment() -> None:
    """Eight callers each awaiting its publish, on a store that takes 4 ms a request. Four start
    while the other four's first segment is being written, so they start as a second cohort, one
    written while the other waits. The callers a write wakes publish again before the waiting
    batch is taken, so the cohorts merge: a segment of 8 per round, not two of 4."""
    b = Backend(
        "memory", {"backend": "memory", "strategy": "conditional_write"}, ServedStore(MemoryStore(), 0.004)
    )
    bq = await b.connect()
    await bq.create_topic("t", partitions=1)
    producer = await bq.register_producer("p")
    seqs: list[int] = []

    async def caller(n: int) -> None:
        for i in range(40):
            seqs.append((await producer.publish("t", f"{n}-{i}")).seq)

    first = [asyncio.ensure_future(caller(n)) for n in range(4)]
    await asyncio.sleep(0.002)  # the first four's segment is in flight
    second = [asyncio.ensure_future(caller(n)) for n in range(4, 8)]
    await asyncio.gather(*first, *second)
    await b.close_all()
    per_segment = Counter(seqs)
    steady = [per_segment[seq] for seq in sorted(per_segment)[5:-5]]
    assert steady and min(steady) == 8, (
        f"messages per segment: {[per_segment[q] for q in sorted(per_segment)]}"
    )


@on_virtual_clock
async def test_an_open_loop_stream_shares_segments() -> None:
    """Publishes launched every 20 ms without awaiting each other: far fewer segments than messages."""
    store = MeteredStore(MemoryStore())
    b = Backend("memory", {"backend": "memory", "strategy": "conditional_write"}, store)
    bq = await b.connect(producer={"linger_ms": 300})
    await bq.create_topic("t", partitions=1)
    producer = await bq.register_producer("p")
    pending = []
    for i in range(60):
        pending.append(asyncio.ensure_future(producer.publish("t", i)))
        await asyncio.sleep(0.02)
    results = await asyncio.gather(*pending)
    await b.close_all()
    segments = {r.seq for r in results}
    assert len(segments) <= 25, f"{len(segments)} segments for 60 paced messages: no batching"


@on_virtual_clock
async def test_acks_of_parallel_handlers_share_deltas() -> None:
    """Acks arriving while a delta is open or in flight ride together (and with claims)."""
    store = MeteredStore(MemoryStore())
    b = Backend("memory", {"backend": "memory", "strategy": "conditional_write"}, store)
    bq = await b.connect(consumer={"commit_linger_ms": 300})
    await bq.create_topic("t", partitions=1)
    producer = await bq.register_producer("p")
    consumer = await bq.register_consumer("c", "t")
    acked = 0

    async def handle(msg) -> None:  # type: ignore[no-untyped-def]
        nonlocal acked
        await asyncio.sleep(0.01)
        acked += 1

    stop = asyncio.Event()
    listener = asyncio.ensure_future(consumer.listen(handle, concurrency=16, stop=stop))
    for i in range(80):
        await producer.publish("t", i) if i % 10 == 0 else asyncio.ensure_future(producer.publish("t", i))
        await asyncio.sleep(0.01)
    deadline = time.monotonic() + 20
    while acked < 80 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    stop.set()
    await listener
    deltas = consumer.counters.commits
    await b.close_all()
    assert acked == 80
    assert deltas < 80, f"{deltas} deltas for 80 claims and 80 acks: settlements did not share them"


async def test_a_batch_acked_one_awaited_ack_at_a_time_is_not_held_by_the_linger() -> None:
    """poll() a batch, then ``for m in batch: await m.ack()``: no segment is arriving, so no claim
    delta will come for the acks to ride with; each is written at once instead of waiting out
    ``commit_linger_ms`` (here 2 s: ten acks would take 20 s)."""
    b = Backend("memory", {"backend": "memory", "strategy": "conditional_write"}, MemoryStore())
    bq = await b.connect(consumer={"commit_linger_ms": 2000, "visibility_timeout_s": 60})
    await bq.create_topic("t", partitions=1)
    producer = await bq.register_producer("p")
    for i in range(10):
        await producer.publish("t", i)
    consumer = await bq.register_consumer("c", "t")
    batch = []
    while len(batch) < 10:
        batch += await consumer.poll(10, 2.0)
    started = time.monotonic()
    for msg in batch:
        await msg.ack()
    took = time.monotonic() - started
    await b.close_all()
    assert took < 2.0, f"ten awaited acks took {took:.2f}s: each waited for company that never came"


# -- a closed loop never waits for company (core/batching.Callers) --------------------------------


@pytest.mark.parametrize(
    ("events", "now", "expected"),
    [
        # (caller, what, at): "seen" a publish started, "wait" its item in a batch, "done" settled
        ([], 0.0, False),  # nobody waits: nothing to close
        ([("a", "wait", 0.0)], 0.0, True),  # one caller, waiting: it cannot bring company
        ([("a", "seen", 0.0)], 0.0, False),  # still preparing its item: it may come
        ([("a", "wait", 0.0), ("b", "wait", 0.0)], 0.0, True),
        ([("a", "wait", 0.0), ("b", "seen", 0.0)], 0.0, False),
        # b finished 0.2 s ago, within the memory (0.35 s): it may publish again
        ([("a", "wait", 1.0), ("b", "wait", 0.8), ("b", "done", 0.8)], 1.0, False),
        # ... 0.5 s ago: forgotten
        ([("a", "wait", 1.0), ("b", "wait", 0.5), ("b", "done", 0.5)], 1.0, True),
        # a caller with two items, one settled, still waits on the other
        ([("a", "wait", 0.0), ("a", "wait", 0.0), ("a", "done", 0.1)], 0.1, True),
        ([("a", "wait", 0.0), ("a", "done", 0.1)], 0.1, False),
        # a waiting caller is never forgotten, however long it waits
        ([("a", "wait", 0.0), ("b", "wait", 9.0)], 10.0, True),
        # a task per message, each done before the next (an open loop): the previous one counts
        ([("t1", "wait", 0.0), ("t1", "done", 0.01), ("t2", "wait", 0.08)], 0.08, False),
    ],
)
def test_a_batch_closes_at_once_when_every_caller_waits(
    events: list[tuple[str, str, float]], now: float, expected: bool
) -> None:
    callers = Callers(0.35)
    for caller, what, at in events:
        {"seen": callers.seen, "wait": callers.waiting, "done": callers.settled}[what](caller, at)
    assert callers.all_waiting(now) is expected


async def _producer_on_a_served_store(linger_ms: float) -> tuple[Backend, Any]:
    """A producer on a store that takes 10 ms a request (virtual), pings off (no sockets)."""
    store = ServedStore(MemoryStore(), 0.010)
    b = Backend(
        "memory", {"backend": "memory", "strategy": "conditional_write", "ping": {"enabled": False}}, store
    )
    bq = await b.connect(producer={"linger_ms": linger_ms})
    await bq.create_topic("t", partitions=1)
    return b, await bq.register_producer("p")


def test_one_awaited_publisher_with_pauses_never_pays_a_linger() -> None:
    """One task publishes, awaits, pauses 0-100 ms, publishes again (the one-at-a-time publisher).
    Its gaps are shorter than the linger, so the estimate probes now and then: each probe held
    the publish for two gaps (about 100 ms) although nothing else could arrive. Now every caller
    of the producer waits on the batch: it is written at once, every time."""

    async def main() -> list[float]:
        b, producer = await _producer_on_a_served_store(350)
        rng = random.Random(25)
        took = []
        for i in range(80):
            started = time.monotonic()
            await producer.publish("t", i)
            took.append(time.monotonic() - started)
            await asyncio.sleep(rng.uniform(0.0, 0.1))
        await b.close_all()
        return took

    took = run_virtual(main)
    steady = took[2:]  # the first publishes find the tail first
    # a segment PUT (10 ms), and at most a background write (head hint, wake touch) ahead of it
    assert max(steady) <= 0.0205, [round(t * 1000, 1) for t in steady]


def test_awaiting_tasks_are_written_as_soon_as_the_last_one_waits() -> None:
    """Eight tasks, each awaiting its publish: a segment of 8 per round, none held for company."""

    async def main() -> tuple[list[float], Counter[int]]:
        b, producer = await _producer_on_a_served_store(350)
        took: list[float] = []
        seqs: Counter[int] = Counter()

        async def caller(n: int) -> None:
            for i in range(30):
                started = time.monotonic()
                seqs[(await producer.publish("t", f"{n}-{i}")).seq] += 1
                took.append(time.monotonic() - started)

        await asyncio.gather(*(caller(n) for n in range(8)))
        await b.close_all()
        return took, seqs

    took, seqs = run_virtual(main)
    steady = [seqs[q] for q in sorted(seqs)[3:-3]]
    assert steady and min(steady) == 8, [seqs[q] for q in sorted(seqs)]
    assert max(took[16:]) <= 0.0305, max(took[16:])  # its own PUT, and at most two ahead of it


def test_a_task_per_message_stream_still_shares_segments() -> None:
    """Open loop: a task per message every 20 ms, none awaiting the others. The caller of the
    previous message counts as one that may come again (it finished within the linger), so the
    open batch waits for company as before."""

    async def main() -> set[int]:
        b, producer = await _producer_on_a_served_store(300)
        pending = []
        for i in range(100):
            pending.append(asyncio.ensure_future(producer.publish("t", i)))
            await asyncio.sleep(0.02)
        results = await asyncio.gather(*pending)
        await b.close_all()
        return {r.seq for r in results}

    segments = run_virtual(main)
    assert len(segments) <= 30, f"{len(segments)} segments for 100 paced messages: no batching"


@pytest.mark.parametrize(
    ("per_producer", "smallest"),
    [
        (12.5, 3),  # 50 msg/s over 4 producers: the linger decides (3 messages in 200 ms)
        (125.0, 25),  # 500 msg/s over 4 producers: the linger decides (25 messages in 200 ms)
    ],
)
def test_balanced_batches_at_the_paced_rates(per_producer: float, smallest: int) -> None:
    """The balanced profile's segment sizes at the benchmark's paced rates. Under a standing
    claim (I20) a segment costs one PUT (itself: no claim delta reads it): 3 messages a segment
    keep 50 msg/s within $2.63 a million at a p50 under 120 ms, and 25 keep 500 msg/s within
    $0.39 (docs/benchmarks.md). (Before standing claims each segment cost two PUTs, and the
    profile lingered 350 ms for 5 and 40.)"""
    producer = ProducerSettings(**PROFILES["balanced"]["producer"])
    batcher = Batcher(producer.linger_ms / 1000, producer.linger_fill_messages)
    sizes = _stream(batcher, gap_s=1 / per_producer, count=4000)
    steady = sizes[len(sizes) // 2 : -1]
    assert min(steady) >= smallest, sizes
