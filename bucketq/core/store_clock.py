"""The store's clock: the reference for every age that decides a deletion, an abandonment or a
takeover (docs/protocol.md, the clock rule, I15).

Objects carry the store's Last-Modified times. An age measured as a host's ``time.time()`` minus
such a time is off by that host's clock error: a GC host whose clock runs ahead by more than a
topic's subscription timeout passed a live group as abandoned and freed what it had not read
(reproduction r10), and a producer whose clock runs ahead took over another producer's live
dedup marker. So every such age is ``store_now - last_modified``, both from the store
(:meth:`~bucketq.storage.port.ObjectStore.now`), and the host's clock is only *compared* with
the store's: a disagreement beyond the margin is reported loudly (a warning naming both clocks
and a counter), because what still uses host clocks (lease deadlines between members, I4 and I10)
relies on the margin.

A reading is the store's time at the answer, truncated to its resolution (whole seconds on S3):
never later than the store's true time. A reading reused for a while is advanced by this host's
monotonic clock from the moment the answer arrived, so it stays an underestimate: ages come out
short, never long (a deletion, an abandonment or a takeover comes late, never early).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from bucketq.core.ids import token
from bucketq.core.keys import Keys
from bucketq.errors import NotSupported, StorageError
from bucketq.storage import Storage

log = logging.getLogger("bucketq.clock")

# How far a host's clock may be from the store's before it is reported (the members' default
# clock-skew margin, clock_skew_s: lease expiry between members relies on it).
CLOCK_MARGIN_S = 2.0
# Store clocks count whole seconds (Last-Modified, Date): a reading is up to this much early.
STORE_CLOCK_RESOLUTION_S = 1.0
# A process reuses a reading this long, advanced by its monotonic clock (a takeover decision needs
# no request of its own); GC reads afresh at every collection.
READING_REUSE_S = 300.0

_warnings = 0


def clock_warnings() -> int:
    """How many times this process found a host clock beyond the margin from the store's."""
    return _warnings


class StoreClock:
    """Readings of the store's clock for one process (or one GC collection)."""

    def __init__(
        self,
        storage: Storage,
        *,
        keys: Keys | None = None,
        margin_s: float = CLOCK_MARGIN_S,
        host_clock: Callable[[], float] | None = None,
        who: str = "this process",
    ) -> None:
        self.storage = storage
        self.keys = keys
        self.margin_s = margin_s
        # the host's wall clock, resolved per call (a patched time.time is seen)
        self.host_clock: Callable[[], float] = host_clock or (lambda: time.time())
        self.who = who
        self._reading: tuple[float, float] | None = None  # (store time, monotonic at the answer)
        self.offset_s: float | None = None  # host minus store, at the last reading
        self.warnings = 0
        self.readings = 0

    async def now(self, *, max_age_s: float = 0.0) -> float:
        """The store's time now (an underestimate, see the module docstring): a new reading, or
        the last one advanced by the monotonic clock when it is younger than ``max_age_s``."""
        if self._reading is not None:
            store, at = self._reading
            elapsed = time.monotonic() - at
            if elapsed < max_age_s:
                return store + elapsed
        return await self.read()

    async def read(self) -> float:
        """Read the store's clock now and compare this host's with it (warned beyond the margin)."""
        before = self.host_clock()
        store = await self._store_time()
        after = self.host_clock()
        self._reading = (store, time.monotonic())
        self.readings += 1
        self._compare(store, before, after)
        return store

    async def _store_time(self) -> float:
        try:
            return await self.storage.now()
        except NotSupported:
            if self.keys is None:
                raise
        # a store that tells no time in its answers: the Last-Modified of an object written now
        # (different bytes every time: a server may keep the old time for an unchanged PUT)
        key = self.keys.probe("clock")
        await self.storage.overwrite(key, json.dumps({"at": time.time(), "n": token()}).encode())
        info = await self.storage.head(key)
        if info is None:
            raise StorageError(f"{key} vanished right after it was written")
        return info.last_modified

    def _compare(self, store: float, before: float, after: float) -> None:
        """Warn when the host's clock is beyond the margin from the store's. The reading is the
        store's time at some instant between ``before`` and ``after`` (host clock), truncated by
        up to the resolution: only a disagreement that no such instant and truncation explain is
        reported."""
        ahead = before - (store + STORE_CLOCK_RESOLUTION_S)  # the host at least this much ahead
        behind = store - after  # ... or at least this much behind
        self.offset_s = (before + after) / 2 - (store + STORE_CLOCK_RESOLUTION_S / 2)
        if ahead > self.margin_s or behind > self.margin_s:
            global _warnings
            _warnings += 1
            self.warnings += 1
            log.warning(
                "%s: the host clock is %.1fs %s the object store's (margin %.1fs): ages that decide "
                "deletions use the store's clock, but lease deadlines between members rely on clocks "
                "within the margin; check NTP on this host",
                self.who,
                abs(self.offset_s),
                "ahead of" if self.offset_s > 0 else "behind",
                self.margin_s,
            )
