"""The application side of a run: producers publishing and consumers polling and acking."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from bucketq import BucketqError, Consumer, Message, Producer
from bucketq.bench.tracker import Tracker

ProgressFn = Callable[[], None]


def make_payload(n: int, size: int) -> dict[str, Any]:
    """A JSON payload of about ``size`` bytes that carries its number ``n``."""
    bare = len(json.dumps({"n": n, "pad": ""}, separators=(",", ":")))
    return {"n": n, "pad": "x" * max(0, size - bare)}


async def publish_one(producer: Producer, topic: str, payload: Any, tracker: Tracker) -> None:
    """Publish and record the outcome (an error is counted, not raised)."""
    started = tracker.publishing()
    try:
        result = await producer.publish(topic, payload)
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


async def produce_paced(
    producers: Sequence[Producer],
    topic: str,
    count: int,
    rate: float,
    tracker: Tracker,
    *,
    payload_bytes: int,
) -> None:
    """Publish ``count`` messages at ``rate`` per second, round-robin over ``producers``, without waiting."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks: list[asyncio.Task[None]] = []
    for n in range(count):
        delay = start + n / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        producer = producers[n % len(producers)]
        tasks.append(
            asyncio.create_task(publish_one(producer, topic, make_payload(n, payload_bytes), tracker))
        )
    await asyncio.gather(*tasks)


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
