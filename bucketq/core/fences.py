"""GC fences: a segment or delta number that was ever taken is never taken again (invariant I1).

Put-if-absent makes a number exclusive only while its object exists. Garbage collection deletes
objects, which would make their numbers writable again: a producer with a stale view of a
partition's tail, or a member retrying a delta after a long outage, would then write into a freed
number *below* every reader's position — acknowledged, and never read. A fence closes that hole.

* A fence is an overwrite object holding ``floor``: numbers below it may be freed. GC raises a
  fence first (phase 1) and deletes below it only once the fence object is at least ``grace_s``
  old (phase 2, a later collection). Fences only rise.
* A writer whose put-if-absent of number ``n`` succeeded accepts the number only if ``n >= floor``
  by a copy of the fence it read less than ``trust_s`` before the put *completed*; otherwise it
  reads the fence again first. ``trust_s`` is well below ``grace_s``: for a freed ``n`` the fence
  covering ``n`` was written after the writer's copy was read (fences only rise and the copy was
  below ``n``) and the deletion came at least ``grace_s`` after that, so a put into a freed number
  always completes more than ``grace_s`` (less the GC host's clock skew against the store) after
  the copy was read — outside the trusted window. A rejected number is an orphan below the floor:
  no reader reads it, and GC deletes it with the rest.
* Readers apply the same rule before trusting that a missing number is the end of a log (a
  collected delta looks like a missing one): see :class:`~bucketq.core.cursor_log.CursorLog`.

Fences are cheap: an active writer re-reads its fence at most once per ``trust_s / 2``, and GC
writes one per partition and cursor log when it frees something.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from bucketq.errors import StorageError
from bucketq.storage import Storage

# Tests and simulations of whole processes only: scales every window below together (trust stays
# below grace by the same ratio). Every process sharing a bucket must use the same scale.
_SCALE = float(os.environ.get("BUCKETQ_FENCE_SCALE", "1"))
# Last-Modified times are whole seconds: an age measured from two of them can be a second too long.
STORE_CLOCK_RESOLUTION_S = 1.0
# Segments: GC deletes below a partition's floor fence only when the fence is this old.
SEGMENT_GRACE_S = 300.0 * _SCALE
# Writers trust a copy of a segment fence this long (leaves 180 s for pauses in the store's clock).
SEGMENT_TRUST_S = 120.0 * _SCALE
# Cursor deltas: the same rule, with the longer windows the cursor logs always had.
DELTA_GRACE_S = 1200.0 * _SCALE
DELTA_TRUST_S = 600.0 * _SCALE


# A fence remembers the floors it held before (with the store time each was written), so that GC
# can free below a floor that has been in place for the grace even while traffic keeps raising the
# fence at every collection (otherwise the fence would never get old enough: GC starvation).
FENCE_HISTORY = 64


@dataclass(frozen=True, slots=True)
class FenceValue:
    """A fence as stored: the first number kept, and when (writer's clock) it was raised."""

    floor: int
    base: int = 0  # segments: the partition offset of ``floor`` (0 for cursor logs)
    at: float = 0.0
    deleted: bool = False  # segments: the topic was deleted (a tombstone kept across re-creation)
    # earlier (floor, last-modified time of the fence object that held it), oldest first
    history: tuple[tuple[int, float], ...] = ()

    def encode(self) -> bytes:
        body: dict[str, object] = {"floor": self.floor, "base": self.base, "at": self.at}
        if self.deleted:
            body["deleted"] = True
        if self.history:
            body["history"] = [list(h) for h in self.history]
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> FenceValue:
        obj = json.loads(data)
        history = tuple((int(f), float(t)) for f, t in obj.get("history", []))
        return cls(
            int(obj["floor"]),
            int(obj.get("base", 0)),
            float(obj.get("at", 0.0)),
            bool(obj.get("deleted")),
            history,
        )

    def freeable_below(self, modified: float, store_now: float, grace_s: float) -> int:
        """The highest floor this fence has held for at least ``grace_s`` (store clock), or 0.

        Safe for the same reason as the current floor (module docstring): each remembered floor
        was written at its recorded time, and a writer's copy below it was read before that.
        """
        held = [*self.history, (self.floor, modified)]
        # Stores give Last-Modified in whole seconds (S3, SeaweedFS, moto): two truncated times
        # can differ by up to a second more than the time that really passed. Without the margin
        # a fence raised at x.9 s and a clock probe at (x+1).0 s would count as a second old
        # (found in a test: GC freed in the same collection that raised the fence).
        return max((f for f, t in held if store_now - t >= grace_s + STORE_CLOCK_RESOLUTION_S), default=0)

    def passed_at(self, n: int, modified: float) -> tuple[float, bool] | None:
        """When (the store's Last-Modified) this fence first held a floor above ``n``, and whether
        that is exact; None when it is not above ``n``. ``modified`` is the fence object's own
        Last-Modified. Exact unless the bounded history dropped the floors before it: then the
        time is only an upper bound (the fence passed ``n`` then or earlier).
        """
        held = [*self.history, (self.floor, modified)]
        for i, (floor, at) in enumerate(held):
            if floor > n:
                # the first floor ever written is in the history unless the history is full
                return at, i > 0 or len(self.history) < FENCE_HISTORY
        return None


def took_before_passed(fence: FenceValue, modified: float, n: int, landed: float) -> bool | None:
    """Whether a put-if-absent of number ``n`` that the store stamped ``landed`` (the object's
    Last-Modified) took ``n`` before ``fence`` first rose above it (True: the object is part of the
    partition, readers may have read it), took a number GC had freed (False: an orphan), or cannot
    be told apart (None: the history no longer says when the fence passed ``n``).

    Why exact, on the store's clock alone (I1, I15): GC raises a fence only over objects it listed
    and read, and deletes below a floor only once the store shows the fence object holding it
    ``grace + 1 s`` old (:meth:`FenceValue.freeable_below`). So an earlier object at ``n`` was
    deleted, and a put into the freed ``n`` stamped, at least a whole second after the fence first
    passed ``n``, even with Last-Modified truncated to seconds; a put stamped no later than that
    moment found ``n`` never taken. A writer that was paused between its put landing and its look
    at the fence (SIGSTOP, a response held up) cannot tell the two cases apart by its own clock.
    """
    if fence.deleted:
        return False  # a tombstone: the topic went; the catalog's fence (I6) decides the rest
    passed = fence.passed_at(n, modified)
    if passed is None:
        return True  # not above n: nothing to tell
    at, exact = passed
    if landed > at:
        return False
    return True if exact else None


async def read_fence(storage: Storage, key: str) -> tuple[FenceValue | None, float | None]:
    """The fence at ``key`` and its object's last-modified time (None, None when there is none).

    A fence that cannot be decoded is an error, never "no fence": treating it as absent could
    admit a freed number.
    """
    blob = await storage.get(key)
    if blob is None:
        return None, None
    try:
        return FenceValue.decode(blob.data), blob.last_modified
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StorageError(f"fence {key} is unreadable: {exc}") from None


async def raise_fence(storage: Storage, key: str, value: FenceValue) -> bool:
    """Overwrite the fence with ``value`` if it is higher than the stored one; True if written.

    The stored floor joins the history with its object's last-modified time.
    """
    current, modified = await read_fence(storage, key)
    if current is not None and current.floor >= value.floor and not value.deleted:
        return False
    if current is not None and modified is not None:
        history = (*current.history, (current.floor, modified))[-FENCE_HISTORY:]
        value = FenceValue(value.floor, value.base, value.at, value.deleted, history)
    await storage.overwrite(key, value.encode())
    return True


class FenceView:
    """A writer's or reader's copy of one fence, with the (monotonic) time it was read."""

    def __init__(self, storage: Storage, key: str, trust_s: float) -> None:
        self.storage = storage
        self.key = key
        self.trust_s = trust_s
        self.value = FenceValue(0)
        self.modified: float | None = None  # the store's Last-Modified of the fence object read
        self.read_at = float("-inf")
        self.reads = 0

    @property
    def floor(self) -> int:
        return self.value.floor

    async def refresh(self) -> FenceValue:
        """Read the fence now (the copy's time is when the read *started*: conservative)."""
        started = time.monotonic()
        value, modified = await read_fence(self.storage, self.key)
        self.reads += 1
        if value is not None and (value.floor >= self.value.floor or value.deleted):
            self.value, self.modified = value, modified
        self.read_at = started
        return self.value

    def trusted_at(self, when: float) -> bool:
        """Whether the copy may be trusted for an operation that completed at ``when`` (monotonic)."""
        return when - self.read_at < self.trust_s

    async def fresh(self) -> FenceValue:
        """The fence, re-read when the copy is older than half the trust window."""
        if time.monotonic() - self.read_at >= self.trust_s / 2:
            await self.refresh()
        return self.value

    async def admits(self, n: int, *, completed_at: float) -> bool:
        """Whether a put-if-absent of number ``n`` that succeeded at ``completed_at`` took a number
        never taken before (see the module docstring for why this is exact)."""
        if n < self.value.floor:
            return False
        if self.trusted_at(completed_at):
            return True
        await self.refresh()
        return n >= self.value.floor
