"""The application side of a run: producers publishing and consumers polling and acking."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bucketq import BucketqError, Consumer, Message, Producer
from bucketq.bench.tracker import Tracker

ProgressFn = Callable[[], None]


def make_payload(n: int, size: int) -> dict[str, Any]:
    """A JSON payload of about ``size`` bytes that carries its number ``n``."""
    bare = len(json.dumps({"n": n, "pad": ""}, separators=(",", ":")))
    return {"n": n, "pad": "x" * max(0, size - bare)}


async def publish_one(
    producer: Producer, topic: str, payload: Any, tracker: Tracker, *, created_at: float | None = None
) -> None:
    """Publish and record the outcome (an error is counted, not raised).

    ``created_at`` (epoch seconds) stamps the message, e.g. with the time it was due to be sent.
    """
    started = tracker.publishing()
    try:
        result = await producer.publish(topic, payload, created_at=created_at)
    except BucketqError:
        tracker.on_publish_error()
    else:
        tracker.on_published(result.id, started)


async def produce(
    producer: Producer,
    topic: str,
    numbers: Iterable[int],
    tracker: Tracker,
    *,
    payload_bytes: int,
    window: int,
    on_publish: ProgressFn | None = None,
) -> None:
    """Publish one message per number as fast as possible, with at most ``window`` publishes pending."""
    slots = asyncio.Semaphore(window)
    tasks: set[asyncio.Task[None]] = set()

    async def one(n: int) -> None:
        try:
            await publish_one(producer, topic, make_payload(n, payload_bytes), tracker)
            if on_publish is not None:
                on_publish()
        finally:
            slots.release()

    for n in numbers:
        await slots.acquire()
        task = asyncio.create_task(one(n))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)


@dataclass
class Pacing:
    """How an open-loop publisher kept to its schedule."""

    max_lag_s: float = 0.0  # the latest a publish started after its due time
    in_flight: int = 0
    peak_in_flight: int = 0  # publishes started and not yet finished, at most


async def produce_paced(
    producers: Sequence[Producer],
    topic: str,
    count: int,
    rate: float,
    tracker: Tracker,
    *,
    payload_bytes: int,
    pacing: Pacing | None = None,
) -> Pacing:
    """Publish ``count`` messages at ``rate`` per second, round-robin over ``producers``: open loop.

    Message ``n`` is due ``n / rate`` seconds after the start and its publish starts then, as a task,
    whether or not earlier publishes have finished (a slow store backs publishes up; it does not
    slow the arrivals). Each message is stamped with its due time, so publish-to-receive latency
    includes any time it waited for the publisher itself. ``pacing`` (returned) is kept up to date
    while it runs.
    """
    loop = asyncio.get_running_loop()
    start, wall_start = loop.time(), time.time()
    pacing = pacing if pacing is not None else Pacing()
    tasks: list[asyncio.Task[None]] = []

    async def one(n: int, producer: Producer) -> None:
        pacing.max_lag_s = max(pacing.max_lag_s, loop.time() - (start + n / rate))
        pacing.in_flight += 1
        pacing.peak_in_flight = max(pacing.peak_in_flight, pacing.in_flight)
        try:
            payload = make_payload(n, payload_bytes)
            await publish_one(producer, topic, payload, tracker, created_at=wall_start + n / rate)
        finally:
            pacing.in_flight -= 1

    for n in range(count):
        delay = start + n / rate - loop.time()
        # behind schedule: no sleep, but still yield, so due publishes start rather than queue up
        await asyncio.sleep(max(0.0, delay))
        tasks.append(asyncio.create_task(one(n, producers[n % len(producers)])))
    await asyncio.gather(*tasks)
    return pacing


async def produce_awaited(
    producer: Producer,
    topic: str,
    count: int,
    tasks: int,
    tracker: Tracker,
    *,
    payload_bytes: int,
) -> None:
    """``tasks`` tasks share ``producer``, each publishing and awaiting one message at a time (closed
    loop) until ``count`` messages are published between them."""
    numbers = iter(range(count))

    async def loop() -> None:
        for n in numbers:  # one shared iterator: each number is taken by exactly one task
            await publish_one(producer, topic, make_payload(n, payload_bytes), tracker)

    await asyncio.gather(*(loop() for _ in range(tasks)))


async def _ack_all(messages: list[Message], tracker: Tracker, on_ack: ProgressFn | None) -> None:
    started = time.perf_counter()
    outcomes = await asyncio.gather(*(m.ack() for m in messages), return_exceptions=True)
    for msg, outcome in zip(messages, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            tracker.on_ack_error()
            continue
        tracker.on_acked(msg.id, started)
        if on_ack is not None:
            on_ack()


async def consume(
    consumer: Consumer,
    tracker: Tracker,
    stop: asyncio.Event,
    *,
    batch: int = 500,
    on_ack: ProgressFn | None = None,
) -> None:
    """Poll until ``stop``; record each delivery and ack it (acks run while the next poll waits)."""
    pending: set[asyncio.Task[None]] = set()
    while not stop.is_set():
        messages = await consumer.poll(max_messages=batch, wait=0.1)
        if not messages:
            continue
        now = time.time()
        for msg in messages:
            tracker.on_received(msg.created_at, now)
        task = asyncio.create_task(_ack_all(messages, tracker, on_ack))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.gather(*pending)


async def wait_done(tracker: Tracker, idle_timeout_s: float) -> bool:
    """Wait until every expected message is acked; give up after ``idle_timeout_s`` without progress."""
    last_count, last_change = -1, time.monotonic()
    while not tracker.done.is_set():
        try:
            await asyncio.wait_for(tracker.done.wait(), 0.5)
        except TimeoutError:
            pass
        progress = tracker.acked + tracker.received + len(tracker.published)
        if progress != last_count:
            last_count, last_change = progress, time.monotonic()
        elif time.monotonic() - last_change > idle_timeout_s:
            return False
    return True
