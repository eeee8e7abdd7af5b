"""Reading and appending one subscription partition's cursor log (deltas + checkpoints).

Invariants this module enforces (docs/protocol.md):

* I1 — a delta number that was ever taken is never taken again. GC frees deltas only below the
  log's trim fence, and only once the fence is old (``core/fences.py``). A put-if-absent that
  succeeded is accepted only when the number is at or above the fence, by a copy of it read less
  than ``DELTA_TRUST_S`` before the put completed.
* I2 — a replica only applies deltas it read while its fence copy was trusted, and reloads from a
  checkpoint when it finds itself below the fence: a delta read after GC freed its number (an
  orphan written there by a stale writer) is never applied.
* I3 — every delta is applied exactly once per replica. A write whose outcome is unknown (lost
  response, timeout) is resolved by reading the log: the member's delta id in ``state.ids``
  (kept in checkpoints too) says whether it landed; it is retried byte for byte only while its
  number is still free.
* I6 — a cursor log belongs to one incarnation of its topic (with a ``topic_fence``). Deltas and
  checkpoints carry the incarnation (format 4); a replica refuses another incarnation's: such a
  delta takes its number with no ops, such a checkpoint is passed over. A delta or checkpoint is
  written only with a marker copy younger than TOPIC_FENCE_S, and a delta counts as written
  only if the copy was that young when the write completed (else :class:`TopicDeleted`): a
  member that missed the topic's deletion and re-creation never writes its old state into the
  purged prefix the new incarnation's log now uses.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bucketq.core.cadence import RETRY_JITTER, retry_delay
from bucketq.core.cursor import CursorState, Delta, Op, apply_delta
from bucketq.core.fences import DELTA_TRUST_S, FenceView
from bucketq.core.foreign import skip_foreign
from bucketq.core.ids import token
from bucketq.core.keys import Keys, seq_of
from bucketq.errors import AlreadyExists, Contended, StorageError, TopicDeleted
from bucketq.storage import Storage

if TYPE_CHECKING:
    from bucketq.core.topics import TopicFence

log = logging.getLogger("bucketq.cursor")

# Another member's delta stamped further than this in our future means a clock is off by more
# than the configured margin: reported (log + counter), since lease expiry relies on the margin.
SKEW_REPORT_S = 5.0


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
        clock: Callable[[], float] | None = None,
        clock_skew_s: float = SKEW_REPORT_S,
        topic_fence: TopicFence | None = None,
    ) -> None:
        self.storage = storage
        self.keys = keys
        self.topic = topic
        self.consumer = consumer
        self.partition = partition
        self.member = member
        self.checkpoint_every = checkpoint_every
        self.max_attempts = max_attempts
        # Resolved per call, not at import: a patched time.time (the simulator's) is seen.
        self.clock: Callable[[], float] = clock or (lambda: time.time())
        self.clock_skew_s = clock_skew_s
        self.state = CursorState()
        self.fence = FenceView(storage, keys.log_trim(topic, consumer, partition), DELTA_TRUST_S)
        # I6: the topic incarnation this log belongs to ("" without a fence: accepts any)
        self.topic_fence = topic_fence
        self.incarnation = topic_fence.incarnation if topic_fence is not None else ""
        self.foreign = 0  # deltas and checkpoints of another incarnation refused
        # the store's Last-Modified of the newest object this replica read (the checkpoint it
        # loaded, or the delta at its tip): when the log was last written, on the store's clock
        self.tip_modified: float | None = None
        self.conflicts = 0
        self.reloads = 0
        self.orphans = 0
        self.skew_seen = 0.0  # the largest lead of another member's clock over ours, in seconds
        self._inflight: Delta | None = None  # a delta whose write outcome is unknown
        self._inflight_results: list[bool] | None = None  # set when a catch-up applied it

    def _delta_key(self, n: int) -> str:
        return self.keys.delta(self.topic, self.consumer, self.partition, n)

    async def _newest_checkpoint(self, *, after: int = 0) -> CursorState | None:
        """The newest readable checkpoint above ``after``. A checkpoint GC deletes between LIST and
        GET is looked for again (never mistaken for an empty log); one that cannot be decoded (a
        killed writer's empty object) is passed over for the next older one (I8)."""
        prefix = self.keys.checkpoints_prefix(self.topic, self.consumer, self.partition)
        start_after = (
            self.keys.checkpoint(self.topic, self.consumer, self.partition, after) if after else None
        )
        for _ in range(10):
            listed = []
            async for info in self.storage.list(prefix, start_after=start_after):
                if seq_of(info.key, "json") is None:
                    skip_foreign(info.key, f"cursor {self.topic}/{self.consumer}/p{self.partition}")
                else:
                    listed.append(info.key)
            vanished = False
            for key in reversed(listed):
                blob = await self.storage.get(key)
                if blob is None:
                    vanished = True
                    break
                try:
                    obj = json.loads(blob.data)
                    if self._foreign(obj.get("inc")):
                        log.warning(
                            "checkpoint %s belongs to another incarnation of topic %s (written by a "
                            "member that missed its deletion); using an older one",
                            key,
                            self.topic,
                        )
                        continue
                    loaded = CursorState.from_json(obj)
                    self._note_modified(blob.last_modified)
                    return loaded
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    log.warning("checkpoint %s cannot be decoded (%s); using an older one", key, exc)
            if not vanished:
                return None
        raise StorageError(
            f"cursor {self.topic}/{self.consumer}/p{self.partition}: checkpoints keep vanishing"
        )

    async def load(self) -> CursorState:
        """Fence, newest checkpoint, then every delta after it until the first missing one."""
        await self.fence.refresh()
        self.tip_modified = None
        state = await self._newest_checkpoint() or CursorState()
        if state.n + 1 < self.fence.floor:
            # deltas up to the fence may be gone, and no checkpoint covers them: cannot happen
            # unless objects were deleted by hand; refuse rather than build a wrong state
            raise StorageError(
                f"cursor {self.topic}/{self.consumer}/p{self.partition}: newest checkpoint {state.n} is "
                f"below the trim fence {self.fence.floor}"
            )
        self.state = state
        self.reloads += 1
        await self._tail()
        return self.state

    async def catch_up(self, *, via_checkpoint: bool = False) -> int:
        """Apply deltas after the local tip until a 404; return how many were applied.

        A replica whose fence copy is no longer trusted re-reads it, and reloads from the newest
        checkpoint if it fell below it; with ``via_checkpoint`` (a replica that only looks in now
        and then) a newer checkpoint, if any, is loaded first, so catching up costs at most one
        checkpoint interval of GETs. Never while a write of ours is unresolved: its delta must be
        seen, not jumped over, to learn its ops' results.
        """
        before = self.state.n
        if via_checkpoint and self.state.n and self._inflight is None:
            newer = await self._newest_checkpoint(after=self.state.n)
            if newer is not None:
                self.state = newer
        await self._tail()
        return max(0, self.state.n - before)

    async def _ensure_fence(self) -> None:
        """I2: before reading forward, a trusted fence copy, and a state at or above it."""
        if not self.fence.trusted_at(time.monotonic() + 1.0):
            await self.fence.refresh()
        if self.state.n + 1 < self.fence.floor:
            log.info(
                "cursor %s/%s/p%d: replica at %d is below the trim fence %d; reloading",
                self.topic,
                self.consumer,
                self.partition,
                self.state.n,
                self.fence.floor,
            )
            await self.load()

    async def _tail(self) -> int:
        applied = 0
        await self._ensure_fence()
        while True:
            blob = await self.storage.get(self._delta_key(self.state.n + 1))
            if not self.fence.trusted_at(time.monotonic()):
                await self._ensure_fence()  # read too late to be sure it is not an orphan
                continue
            if blob is None:
                return applied
            self._note_modified(blob.last_modified)
            delta = _decode_delta(blob.data, self.state.n + 1)
            if self._foreign(delta.inc):
                # I6: written for another incarnation of the topic into the prefix this one uses
                # (a member that missed a deletion); it takes its number, with no ops, in every
                # replica of this incarnation alike
                log.warning(
                    "cursor %s/%s/p%d: delta %d belongs to another incarnation of the topic; it counts "
                    "as an empty delta",
                    self.topic,
                    self.consumer,
                    self.partition,
                    delta.n,
                )
                delta = Delta(delta.n, "", "", 0.0, [])
            self._check_clock(delta)
            results = apply_delta(self.state, delta)
            if self._inflight is not None and delta.id == self._inflight.id:
                self._inflight_results = results  # our write landed; its response was lost
            applied += 1

    def _note_modified(self, last_modified: float) -> None:
        self.tip_modified = max(last_modified, self.tip_modified or last_modified)

    def _foreign(self, inc: object) -> bool:
        """Whether an object stamped ``inc`` belongs to another incarnation than this log's (an
        object without a stamp, and a log without an incarnation, match any)."""
        if isinstance(inc, str) and inc and self.incarnation and inc != self.incarnation:
            self.foreign += 1
            return True
        return False

    async def _confirm_topic(self, at: float) -> None:
        """The topic fence (I6): raise TopicDeleted unless the topic was live, as this log's
        incarnation, by a marker read less than TOPIC_FENCE_S before ``at``. A write of unknown
        outcome is dropped with it: whatever it did, it did to a topic that is gone."""
        if self.topic_fence is None:
            return
        try:
            await self.topic_fence.confirm(at)
        except TopicDeleted:
            self._inflight = None
            self._inflight_results = None
            raise

    def _check_clock(self, delta: Delta) -> None:
        """I10: a clock off by more than the margin is reported (lease expiry relies on it): a
        delta stamped more than ``clock_skew_s`` in our future is logged, naming its member, and
        the largest lead seen is kept in ``skew_seen``."""
        if not delta.member:
            return  # an undecodable delta: no clock to compare
        lead = delta.at - self.clock()
        if lead > self.skew_seen:
            self.skew_seen = lead
        if lead > self.clock_skew_s and delta.member != self.member:
            log.warning(
                "cursor %s/%s/p%d: member %s's clock is %.1fs ahead of ours (margin %.1fs): lease "
                "expiry may be early; check NTP on both hosts",
                self.topic,
                self.consumer,
                self.partition,
                delta.member,
                lead,
                self.clock_skew_s,
            )

    async def _resolve_inflight(self) -> CommitOutcome | None:
        """Learn whether the delta of unknown outcome landed (I3). Returns its outcome if it did;
        clears it if it was lost; keeps it (to retry byte for byte) while its number is free."""
        delta = self._inflight
        assert delta is not None
        self._inflight_results = None
        await self._tail()
        if self._inflight_results is not None:
            await self._confirm_topic(time.monotonic())  # it landed before now: in a live topic?
            return self._finish(delta, 0, self._inflight_results, applied=True)
        if self.state.n >= delta.n:
            if self.state.ids.get(self.member, ("", 0.0))[0] == delta.id:
                # landed, and was covered by a checkpoint we loaded: judge each op by the state
                await self._confirm_topic(time.monotonic())
                return self._finish(delta, 0, [_held(self.state, op) for op in delta.ops], applied=True)
            self._inflight = None  # another delta took the number: ours never landed
        return None

    async def commit(self, build: Callable[[CursorState], list[Op]]) -> CommitOutcome | None:
        """Append one delta built by ``build`` from the current state; rebase and rebuild on 412.

        Returns None when ``build`` had nothing to say. A delta whose write outcome is unknown is
        resolved first (see ``_resolve_inflight``): a landed one is returned as this commit's
        outcome (the caller's ops are then built again in the next cycle).
        """
        conflicts = 0
        attempt = 0
        if self._inflight is not None:
            resolved = await self._resolve_inflight()
            if resolved is not None:
                return resolved
        else:
            await self._ensure_fence()
        while True:
            attempt += 1
            if attempt > self.max_attempts:
                raise StorageError(
                    f"cursor {self.topic}/{self.consumer}/p{self.partition}: gave up after {attempt - 1} attempts"
                )
            delta = self._inflight
            if delta is None:
                ops = build(self.state)
                if not ops:
                    return None
                delta = Delta(self.state.n + 1, self.member, token(), self.clock(), ops, inc=self.incarnation)
            body = json.dumps(delta.to_json(), separators=(",", ":")).encode()
            # I6: no write is even started into a topic that may be gone (a copy of its marker
            # older than TOPIC_FENCE_S is read again first)
            await self._confirm_topic(time.monotonic())
            try:
                self._inflight = delta
                await self.storage.create(self._delta_key(delta.n), body)
            except AlreadyExists:
                resolved = await self._resolve_inflight()
                if resolved is not None:
                    resolved.conflicts = conflicts
                    return resolved
                conflicts += 1
                self.conflicts += 1
                continue
            except Contended:
                await asyncio.sleep(random.uniform(0.05, 0.25))
                continue
            except StorageError:
                if attempt >= self.max_attempts:
                    raise
                await asyncio.sleep(retry_delay(attempt, random.uniform(*RETRY_JITTER)))
                resolved = await self._resolve_inflight()
                if resolved is not None:
                    resolved.conflicts = conflicts
                    return resolved
                continue
            completed = time.monotonic()
            if not await self.fence.admits(delta.n, completed_at=completed):
                # I1: the write completed after GC may have freed its number (this replica was
                # stale, or the member paused between the PUT and its answer). Reload: if the
                # checkpoint that covers the number names this delta our newest, it landed
                # before the number was freed, and each op is judged from the state (I3).
                # Otherwise it is an orphan below the fence that nobody reads: build the ops again.
                self._inflight = None
                await self.load()
                if self.state.ids.get(self.member, ("", 0.0))[0] == delta.id:
                    await self._confirm_topic(time.monotonic())
                    return self._finish(
                        delta, conflicts, [_held(self.state, op) for op in delta.ops], applied=True
                    )
                self.orphans += 1
                log.warning(
                    "cursor %s/%s/p%d: delta %d landed below the trim fence %d; writing its ops again",
                    self.topic,
                    self.consumer,
                    self.partition,
                    delta.n,
                    self.fence.floor,
                )
                continue
            # I6: acknowledged only if the topic was live, as this incarnation, when it landed
            await self._confirm_topic(completed)
            return self._finish(delta, conflicts, apply_delta(self.state, delta), applied=True)

    def _finish(self, delta: Delta, conflicts: int, results: list[bool], *, applied: bool) -> CommitOutcome:
        self._inflight = None
        self._inflight_results = None
        if applied and delta.n % self.checkpoint_every == 0 and self.state.n == delta.n:
            self._checkpoint_soon()
        return CommitOutcome(delta, results, conflicts)

    def _checkpoint_soon(self) -> None:
        obj = self.state.to_json()
        if self.incarnation:
            obj["inc"] = self.incarnation  # format 4: loaders of another incarnation pass it over
        body = json.dumps(obj, separators=(",", ":")).encode()
        key = self.keys.checkpoint(self.topic, self.consumer, self.partition, self.state.n)
        task = asyncio.get_running_loop().create_task(self._write_checkpoint(key, body))
        _background.add(task)
        task.add_done_callback(_background.discard)

    async def _write_checkpoint(self, key: str, body: bytes) -> None:
        try:
            if self.topic_fence is not None:  # I6, as for deltas (a background write: no state touched)
                await self.topic_fence.confirm(time.monotonic())
            await self.storage.create(key, body)
        except (AlreadyExists, Contended):
            pass  # identical bytes from another writer, or one is being written
        except TopicDeleted:
            pass  # the topic went away: its cursor logs went with it
        except StorageError as exc:
            log.warning("checkpoint %s not written (%s); the log stays complete", key, exc)


def _decode_delta(data: bytes, n: int) -> Delta:
    """The delta at number ``n``; an object that cannot be decoded (the 0-byte object some stores
    keep when a writer dies between ``100 Continue`` and its body) takes its number with no ops.
    Every replica decides the same way, so they still converge (I8); its writer never got a
    success, so it resolves its write as lost (I3) and builds its ops again.

    Ops of a kind this version does not know are dropped from the delta (they are invalid here,
    every replica of this version skips them alike) and reported: their writer runs a newer
    bucket format than this process supports (see ``bucketq.core.cursor``)."""
    try:
        delta = Delta.from_json(json.loads(data))
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("cursor delta %d cannot be decoded (%s); it counts as an empty delta", n, exc)
        return Delta(n, "", "", 0.0, [])
    if delta.unknown_ops:
        log.warning(
            "cursor delta %d holds ops of unknown kinds %s (written by a newer bucketq?); they are "
            "skipped as invalid",
            n,
            ", ".join(sorted(set(delta.unknown_ops))),
        )
    return delta


def _held(state: CursorState, op: Op) -> bool:
    """An op's validity judged from a later state (its delta was covered by a checkpoint).

    Conservative where the state cannot tell: a claim or extend counts only if the lease is still
    ours, so nothing is handed out or kept on a lease that might not be held.
    """
    lease = state.leases.get(op.pos)
    if op.kind in ("claim", "extend"):
        return lease is not None and lease.token == op.token and (op.until is None or lease.until >= op.until)
    if op.kind in ("ack", "dead"):
        return state.is_done(op.pos)
    if op.kind == "release":
        return lease is None or lease.token != op.token
    if op.kind == "stand":
        # a take or renewal counts only if the standing claim is still ours (nothing is handed
        # out under one that might not be held); a give-back only if it is no longer ours
        st = state.standing
        ours = st is not None and st.token == op.token and (op.until is None or st.until >= op.until)
        return not ours if op.count == 0 else ours
    return True


_background: set[asyncio.Task[None]] = set()
