"""Group commit without a fixed wait: when a producer's batch is worth lingering for, and how long.

A producer writes one segment at a time per partition, and whatever arrives meanwhile rides in the
next one (database-style group commit). (The consumer's settlements use a simpler rule: they ride
along with the next claim delta unless the app waits on them; ``Consumer._settle_due``.)
Waiting longer than that only pays when more arrivals are coming *independently* of the write:

* open-loop traffic (a paced producer, acks of messages the app handles in parallel) keeps
  arriving while a batch is open or in flight: at rate ``r``, lingering up to ``L`` gathers
  ``r * L`` more items per request, which is what makes a light load cheap;
* closed-loop callers (tasks each awaiting their own publish or ack) stop arriving once they all
  wait: lingering then only adds latency, so a batch is closed after a short silence.

:class:`Batcher` measures ``r`` as the arrivals seen while a batch was open or being written,
divided by that busy time, exponentially decayed so it follows the load. It lingers only when at
least one more arrival is expected within ``L``, and closes the batch at ``L`` after its first
item, or after a silence of ``SILENCE_GAPS`` mean gaps (the stream paused or every caller waits).
The gap is the mean over busy time (``1 / r``), except for bursts: a closed loop of N awaiting
callers arrives together right after each write and then not at all while the next is written,
so ``1 / r`` is a write's length divided by N (1.1 ms for 8 callers and a 9 ms round) and would
hold every burst that long for nothing. When a batch's own arrivals come ``BURST_RATIO`` times
closer together than that, the silence is two of their gaps.
It also closes early, at no cost in requests:

* when the next arrival is not expected before that deadline (a paced stream's batch is written
  with its last item, not a gap later, empty-handed);
* once the batch holds ``fill`` items: the request is then already shared by enough items that
  lingering on would add latency for a saving of cents per million (``linger_fill_messages``).

A closed loop (including one task awaiting each call) thus never measures arrivals while it
waits, and is written at once: no fixed linger ever delays an awaited call.

**A closed loop never waits for company** (:class:`Callers`). The estimate cannot tell a closed
loop from a slow stream: a probe, or a rate measured while callers were still arriving, would hold
the batch of callers that all wait on it. So a producer also knows who publishes through it: each
caller (an asyncio task, or what the caller declares itself, e.g. a sidecar's HTTP connection) that
published within the linger. When every one of them is waiting on a batch of this producer, no
more items can arrive before the open batch is written: it is written at once, whatever the
estimate says. A caller that finished within the linger, or one that is still preparing its
message, counts as one that may come: an open-loop stream (a task per message, or callers that
never wait) keeps its batching.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Hashable

# The estimate follows the load over about this long (wall time).
DECAY_S = 5.0
# Below this much busy time the estimate has too little evidence: no lingering.
MIN_EVIDENCE_S = 0.002
# A batch closes after this many mean inter-arrival gaps without an arrival.
SILENCE_GAPS = 2.0
# A batch's arrivals are a burst when they come this many times closer together than the mean
# gap over busy time: the silence is then measured in the burst's own gaps. Below it (a paced
# stream whose publishes start a few at a time when the event loop falls behind), the mean gap:
# a silence of two burst gaps would close such a batch before its next, regular arrival.
BURST_RATIO = 8.0
# ... but never waits for silence less than this.
MIN_SILENCE_S = 0.0001
# An event loop's timers fire no finer than this (epoll counts milliseconds): a shorter wait would
# sleep a whole one. A writer waits out a shorter silence by letting the loop run what is ready
# (callers its last write woke publish again then) and closing unless that brought an item.
TIMER_RESOLUTION_S = 0.001
# close_at's answer for "write it now": before any monotonic reading.
AT_ONCE = float("-inf")
# Without evidence, a batch lingers at most this often, as a probe: a paced stream whose items
# never happen to arrive during a write would otherwise never show itself (its next item comes
# during the probe), while a closed loop pays one short silence per probe.
PROBE_EVERY_S = 1.0


class Batcher:
    """When to close the open batch of one writer (one partition's appender or cursor log)."""

    def __init__(self, linger_s: float, fill: int | None = None) -> None:
        if fill is not None and fill < 1:
            raise ValueError(f"fill must be 1 or more, got {fill}")
        self.linger_s = linger_s
        self.fill = fill
        self._arrivals = 0.0  # decayed count of arrivals while busy
        self._busy_s = 0.0  # decayed busy seconds
        self._decayed_at = float("-inf")
        self._busy_since: float | None = None  # a batch is open or being written
        self.first_at: float | None = None  # first arrival of the open batch
        self.last_at: float | None = None  # latest arrival
        self._gap_s: float | None = None  # mean gap between any two arrivals (decayed)
        self._batch_gap_s: float | None = None  # mean gap between arrivals of one batch (decayed)
        self._next_probe = 0.0
        self._probing: float | None = None  # first_at of the batch being probed

    # -- observations ----------------------------------------------------------------------------

    def _decay(self, now: float) -> None:
        if now > self._decayed_at:
            keep = math.exp(-(now - self._decayed_at) / DECAY_S)
            self._arrivals *= keep
            self._busy_s *= keep
            self._decayed_at = now

    def _account_busy(self, now: float) -> None:
        if self._busy_since is not None and now > self._busy_since:
            self._decay(now)
            self._busy_s += now - self._busy_since
            self._busy_since = now

    def arrived(self, now: float | None = None) -> None:
        """An item joined the open batch (opening it when none was)."""
        now = time.monotonic() if now is None else now
        if self.last_at is not None:
            gap = min(max(now - self.last_at, 0.0), 10.0)
            self._gap_s = gap if self._gap_s is None else 0.8 * self._gap_s + 0.2 * gap
            if self.first_at is not None:  # the batch is open: a gap inside it
                prev = self._batch_gap_s
                self._batch_gap_s = gap if prev is None else 0.8 * prev + 0.2 * gap
        if self._busy_since is None:
            self._busy_since = now  # the opening arrival is not evidence of a stream
            if now - self._decayed_at > DECAY_S:  # quiet for long: what was measured is history
                self._arrivals = self._busy_s = 0.0
                self._decayed_at = now
        else:
            self._account_busy(now)
            self._arrivals += 1
        if self.first_at is None:
            self.first_at = now
        self.last_at = now

    def taken(self) -> None:
        """The open batch was handed to the writer (what arrives next opens another)."""
        self.first_at = None

    def idle(self, now: float | None = None) -> None:
        """Nothing is open or in flight any more."""
        now = time.monotonic() if now is None else now
        self._account_busy(now)
        self._busy_since = None
        self.first_at = None

    # -- decisions -------------------------------------------------------------------------------

    def rate(self, now: float | None = None) -> float:
        """Arrivals per second while busy (0 without enough evidence)."""
        now = time.monotonic() if now is None else now
        self._account_busy(now)
        self._decay(now)
        if self._busy_s < MIN_EVIDENCE_S:
            return 0.0
        return self._arrivals / self._busy_s

    def close_at(self, now: float | None = None, size: int = 1) -> float:
        """The monotonic time at which the open batch of ``size`` items should be written
        (:data:`AT_ONCE`: now)."""
        now = time.monotonic() if now is None else now
        if self.first_at is None or self.last_at is None or self.linger_s <= 0:
            return AT_ONCE
        if self.fill is not None and size >= self.fill:
            return AT_ONCE
        rate = self.rate(now)
        if rate * self.linger_s >= 1.0:
            deadline = self.first_at + self.linger_s
            if self.last_at + 1.0 / rate > deadline:
                return AT_ONCE  # the next item is not expected in time: waiting only delays these
            gap_s = 1.0 / rate
            burst_gap = self._batch_gap_s
            if burst_gap is not None and burst_gap * BURST_RATIO < gap_s:
                gap_s = burst_gap  # bursts: callers that arrive together, then all wait
            silence = max(MIN_SILENCE_S, min(self.linger_s, SILENCE_GAPS * gap_s))
            return min(deadline, self.last_at + silence)
        # not even one more arrival expected while busy: waiting buys nothing, except as a probe
        gap = self._gap_s
        if gap is None or gap <= 0 or gap > self.linger_s:
            return AT_ONCE
        if self._probing != self.first_at:
            if now < self._next_probe:
                return AT_ONCE
            self._probing, self._next_probe = self.first_at, now + PROBE_EVERY_S
        silence = max(MIN_SILENCE_S, min(self.linger_s, SILENCE_GAPS * gap))
        return min(self.first_at + self.linger_s, self.last_at + silence)


class Callers:
    """Who publishes through one producer, and whether all of them wait on its batches.

    ``seen`` when a caller starts a publish, ``waiting`` once its item is in a batch, ``settled``
    when that item is durable (or failed). A caller is remembered for ``memory_s`` after it was
    last seen or settled: it may publish again within that time. :meth:`all_waiting` is True when
    every remembered caller has an item waiting: nothing more can arrive before the open batch is
    written (invariant of the producer's group commit: a batch whose every possible source of
    company is waiting on it is never held).
    """

    def __init__(self, memory_s: float) -> None:
        self.memory_s = memory_s
        self._last: dict[Hashable, float] = {}  # caller -> when it was last seen or settled
        self._waiting: Counter[Hashable] = Counter()  # caller -> its items in batches

    def seen(self, caller: Hashable, now: float | None = None) -> None:
        self._last[caller] = time.monotonic() if now is None else now

    def waiting(self, caller: Hashable, now: float | None = None) -> None:
        self.seen(caller, now)
        self._waiting[caller] += 1

    def settled(self, caller: Hashable, now: float | None = None) -> None:
        self.seen(caller, now)
        left = self._waiting[caller] - 1
        if left > 0:
            self._waiting[caller] = left
        else:
            del self._waiting[caller]

    def __len__(self) -> int:
        """Callers remembered (waiting or seen within ``memory_s``, as of the last check)."""
        return len(self._last)

    def all_waiting(self, now: float | None = None) -> bool:
        """Every caller remembered has an item waiting (and there is at least one)."""
        now = time.monotonic() if now is None else now
        for caller in [c for c, at in self._last.items() if now - at > self.memory_s]:
            if caller not in self._waiting:
                del self._last[caller]
        return bool(self._waiting) and len(self._waiting) == len(self._last)
