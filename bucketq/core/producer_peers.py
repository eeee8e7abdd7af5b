"""Live producers, so that unkeyed traffic splits partitions between them instead of colliding."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from bucketq.core.keys import Keys, heartbeat_member
from bucketq.core.registry import Registration, Registry
from bucketq.errors import StorageError
from bucketq.storage import Storage

log = logging.getLogger("bucketq.producer")

REFRESH_S = 30.0
FIRST_REFRESH_S = 1.0
MIN_REFRESH_GAP_S = 1.0
TTL_S = 3 * REFRESH_S


class ProducerPeers:
    """Heartbeats this producer's registration and keeps the sorted ids of live producers.

    Producer ``i`` of ``n`` live producers takes the partitions ``p`` with ``p % n == i``, so with
    partitions >= producers no two producers append to the same partition (no 412s on segments).
    """

    def __init__(self, storage: Storage, keys: Keys, registry: Registry, registration: Registration) -> None:
        self.storage = storage
        self.keys = keys
        self.registry = registry
        self.registration = registration
        self.id = registration.id
        self.ids: list[str] = [registration.id]
        self._next = time.monotonic() + FIRST_REFRESH_S
        self._last = 0.0
        self._task: asyncio.Task[None] | None = None

    def partitions_for(self, partitions: int) -> list[int]:
        """This producer's share of ``range(partitions)`` (never empty)."""
        n = len(self.ids)
        i = self.ids.index(self.id) if self.id in self.ids else 0
        return [p for p in range(partitions) if p % n == i] or [i % partitions]

    def tick(self, *, soon: bool = False) -> None:
        """Refresh in the background when due (or ``soon`` after a conflict, rate-limited)."""
        now = time.monotonic()
        due = now >= self._next or (soon and now - self._last >= MIN_REFRESH_GAP_S)
        if due and (self._task is None or self._task.done()):
            self._last = now
            self._next = now + REFRESH_S
            self._task = asyncio.get_running_loop().create_task(self.refresh())

    async def refresh(self, *, heartbeat: bool = True) -> None:
        try:
            if heartbeat:
                self.registration = await self.registry.heartbeat(self.registration)
            prefix = self.keys.producers_prefix()
            now = time.time()
            live = [
                member
                async for info in self.storage.list(prefix)
                if (member := heartbeat_member(info.key, prefix)) is not None
                and now - info.last_modified <= TTL_S
            ]
        except StorageError as exc:
            log.debug("producer list not refreshed: %s", exc)
            return
        self.ids = sorted(set(live) | {self.id})

    async def close(self) -> None:
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
