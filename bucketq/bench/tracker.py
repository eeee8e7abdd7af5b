"""Delivery bookkeeping of a run: what was published, received and acked; duplicates, losses, latency."""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100, nearest rank) of ``values``, or None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


# The trackers alive in this process, for progress displays (``bucketq bench`` draws a bar from
# their counts): a display only reads them. Weak: a finished run's tracker goes with its run.
ACTIVE: weakref.WeakValueDictionary[int, Tracker] = weakref.WeakValueDictionary()


@dataclass
class Tracker:
    """Counts one run's messages. ``done`` is set once ``expected`` distinct messages are acked."""

    expected: int
    published: set[str] = field(default_factory=set)
    publish_errors: int = 0
    publish_latencies: list[float] = field(default_factory=list)
    receive_latencies: list[float] = field(default_factory=list)
    ack_latencies: list[float] = field(default_factory=list)
    acks: Counter[str] = field(default_factory=Counter)
    ack_errors: int = 0
    received: int = 0
    first_publish: float | None = None
    last_publish: float | None = None
    first_receive: float | None = None
    last_ack: float | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        ACTIVE[id(self)] = self

    def expect(self, count: int) -> None:
        """Change how many distinct acks complete the run (e.g. once publishing is over)."""
        self.expected = count
        if len(self.acks) >= count:
            self.done.set()

    def publishing(self) -> float:
        """Call just before a publish; returns the start time."""
        now = time.perf_counter()
        if self.first_publish is None:
            self.first_publish = now
        return now

    def on_published(self, message_id: str, started: float) -> None:
        now = time.perf_counter()
        self.published.add(message_id)
        self.publish_latencies.append(now - started)
        self.last_publish = now

    def on_publish_error(self) -> None:
        self.publish_errors += 1

    def on_received(self, created_at: float, received_at: float) -> None:
        self.received += 1
        if self.first_receive is None:
            self.first_receive = time.perf_counter()
        self.receive_latencies.append(max(0.0, received_at - created_at))

    def on_acked(self, message_id: str, started: float) -> None:
        now = time.perf_counter()
        self.acks[message_id] += 1
        self.ack_latencies.append(now - started)
        if self.acks[message_id] == 1:
            self.last_ack = now
            if len(self.acks) >= self.expected:
                self.done.set()

    def on_ack_error(self) -> None:
        self.ack_errors += 1

    @property
    def acked(self) -> int:
        """Distinct messages acked."""
        return len(self.acks)

    @property
    def duplicates(self) -> int:
        """Extra successful acks of messages already acked (a message delivered and acked twice)."""
        return sum(n - 1 for n in self.acks.values() if n > 1)

    @property
    def lost(self) -> int:
        """Messages whose publish was acknowledged but that were never acked by a consumer."""
        return len(self.published - self.acks.keys())


def ms(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile of ``values`` (seconds) in milliseconds, rounded; None when empty."""
    found = percentile(values, q)
    return None if found is None else round(found * 1000, 2)


def latency_summary(tracker: Tracker) -> dict[str, float | None]:
    """p50 and p99 of each latency the tracker recorded (publish, receive, ack), in ms."""
    return {
        "publish_p50_ms": ms(tracker.publish_latencies, 50),
        "publish_p99_ms": ms(tracker.publish_latencies, 99),
        "receive_p50_ms": ms(tracker.receive_latencies, 50),
        "receive_p99_ms": ms(tracker.receive_latencies, 99),
        "ack_p50_ms": ms(tracker.ack_latencies, 50),
        "ack_p99_ms": ms(tracker.ack_latencies, 99),
    }
