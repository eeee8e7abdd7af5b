"""Reading and appending one subscription partition's cursor log (deltas + checkpoints)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from bucketq.core.cursor import CursorState, Delta, Op, apply_delta
from bucketq.core.ids import token
from bucketq.core.keys import Keys, parse_seq
from bucketq.errors import AlreadyExists, Contended, StorageError
from bucketq.storage import Storage

log = logging.getLogger("bucketq.cursor")

# A replica not synced with its log for this long reloads from the newest checkpoint before it
# writes: garbage collection only deletes deltas older than GC_DELTA_GRACE_S (twice as long), so a
# replica can never mistake a collected delta's 404 for the tip of the log.
RELOAD_AFTER_S = 600.0
GC_DELTA_GRACE_S = 2 * RELOAD_AFTER_S


@dataclass(slots=True)
class CommitOutcome:
    """What one successful commit wrote: its ops, their validity, and how many rebases it took."""

    delta: Delta
    results: list[bool]
    conflicts: int


class CursorLog:
    """The in-memory replica of one cursor log, kept current by reading deltas after its tip."""

    def __init__(
        self,
        storage: Storage,
        keys: Keys,
        topic: str,
        consumer: str,
        partition: int,
        member: str,
        *,
        checkpoint_every: int = 64,
        max_attempts: int = 50,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.storage = storage
        self.keys = keys
        self.topic = topic
        self.consumer = consumer
        self.partition = partition
        self.member = member
        self.checkpoint_every = checkpoint_every
        self.max_attempts = max_attempts
        self.clock = clock
        self.state = CursorState()
        self.synced_at = float("-inf")  # monotonic time the replica last reached the log's tip
        self.conflicts = 0
        self._inflight: Delta | None = None  # a delta whose write outcome is unknown

    def _delta_key(self, n: int) -> str:
        return self.keys.delta(self.topic, self.consumer, self.partition, n)

    async def load(self) -> CursorState:
        """Newest checkpoint, then every delta after it until the first missing one."""
        newest: str | None = None
        async for info in self.storage.list(
            self.keys.checkpoints_prefix(self.topic, self.consumer, self.partition)
        ):
            newest = info.key
        state = CursorState()
        if newest is not None:
            blob = await self.storage.get(newest)
            if blob is not None:
                state = CursorState.from_json(json.loads(blob.data))
        self.state = state
        await self._tail()
        return self.state

    async def catch_up(self, *, via_checkpoint: bool = False) -> int:
        """Apply deltas after the local tip until a 404; return how many were applied.

        A replica that lost touch with the log for long reloads from the newest checkpoint instead;
        with ``via_checkpoint`` (a replica that only looks in now and then) a newer checkpoint, if
        any, is loaded first, so catching up costs at most one checkpoint interval of GETs.
        """
        if via_checkpoint and self.state.n:
            newer: str | None = None
            async for info in self.storage.list(
                self.keys.checkpoints_prefix(self.topic, self.consumer, self.partition),
                start_after=self.keys.checkpoint(self.topic, self.consumer, self.partition, self.state.n),
            ):
                newer = info.key
            if newer is not None:
                blob = await self.storage.get(newer)
                if blob is not None:
                    before = self.state.n
                    self.state = CursorState.from_json(json.loads(blob.data))
                    return self.state.n - before + await self._tail()
        if time.monotonic() - self.synced_at > RELOAD_AFTER_S:
            before = self.state.n
            await self.load()
            return max(0, self.state.n - before)
        return await self._tail()

    async def _tail(self) -> int:
        applied = 0
        while True:
            blob = await self.storage.get(self._delta_key(self.state.n + 1))
            if blob is None:
                self.synced_at = time.monotonic()
                return applied
            apply_delta(self.state, Delta.from_json(json.loads(blob.data)))
            applied += 1

    async def commit(self, build: Callable[[CursorState], list[Op]]) -> CommitOutcome | None:
        """Append one delta built by ``build`` from the current state; rebase and rebuild on 412.

        Returns None when ``build`` had nothing to say. A delta whose write outcome is unknown
        (timeout, lost response) is retried byte-for-byte first, so no op is ever written twice
        under two numbers and a write that landed is recognised by its id.
        """
        conflicts = 0
        attempt = 0
        if self._inflight is None and time.monotonic() - self.synced_at > RELOAD_AFTER_S:
            await self.load()
        while True:
            attempt += 1
            delta = self._inflight
            if delta is None:
                ops = build(self.state)
                if not ops:
                    return None
                delta = Delta(self.state.n + 1, self.member, token(), self.clock(), ops)
            body = json.dumps(delta.to_json(), separators=(",", ":")).encode()
            try:
                self._inflight = delta
                await self.storage.create(self._delta_key(delta.n), body)
            except AlreadyExists:
                if await self._landed(delta):
                    return self._finish(delta, conflicts)
                self._inflight = None
                conflicts += 1
                self.conflicts += 1
                await self.catch_up()
            except Contended:
                await asyncio.sleep(random.uniform(0.05, 0.25))
            except StorageError:
                if attempt >= self.max_attempts:
                    raise
                await asyncio.sleep(min(2.0, 0.05 * 2 ** min(attempt, 6)) * random.uniform(0.5, 1.0))
                continue
            else:
                return self._finish(delta, conflicts)
            if attempt >= self.max_attempts:
                raise StorageError(
                    f"cursor {self.topic}/{self.consumer}/p{self.partition}: "
                    f"gave up after {attempt} contended attempts"
                )

    async def _landed(self, delta: Delta) -> bool:
        blob = await self.storage.get(self._delta_key(delta.n))
        if blob is None:
            return False
        return bool(json.loads(blob.data).get("id") == delta.id)

    def _finish(self, delta: Delta, conflicts: int) -> CommitOutcome:
        self._inflight = None
        self.synced_at = time.monotonic()
        results = apply_delta(self.state, delta)
        if delta.n % self.checkpoint_every == 0:
            self._checkpoint_soon()
        return CommitOutcome(delta, results, conflicts)

    def _checkpoint_soon(self) -> None:
        body = json.dumps(self.state.to_json(), separators=(",", ":")).encode()
        key = self.keys.checkpoint(self.topic, self.consumer, self.partition, self.state.n)
        task = asyncio.get_running_loop().create_task(self._write_checkpoint(key, body))
        _background.add(task)
        task.add_done_callback(_background.discard)

    async def _write_checkpoint(self, key: str, body: bytes) -> None:
        try:
            await self.storage.create(key, body)
        except (AlreadyExists, Contended):
            pass  # identical bytes from another writer, or one is being written
        except StorageError as exc:
            log.warning("checkpoint %s not written (%s); the log stays complete", key, exc)


_background: set[asyncio.Task[None]] = set()


async def checkpoint_numbers(storage: Storage, keys: Keys, topic: str, consumer: str, partition: int) -> list[int]:
    """The checkpoint numbers present, ascending (for GC)."""
    return [
        parse_seq(info.key)
        async for info in storage.list(keys.checkpoints_prefix(topic, consumer, partition))
    ]
