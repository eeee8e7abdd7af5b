"""A consumer (group member): prefetches leases over its topics and settles them in group commits."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from bucketq.config import ConsumerSettings
from bucketq.core import cadence
from bucketq.core.cursor import Pos
from bucketq.core.hooks import CommitHook
from bucketq.core.ids import token
from bucketq.core.keys import Keys
from bucketq.core.membership import Membership
from bucketq.core.message import Message, Receipt
from bucketq.core.models import DeadLetterConfig, TopicConfig
from bucketq.core.partition_worker import (
    HAND_OUT_MARGIN_S,
    CycleResult,
    Intent,
    IntentKind,
    Look,
    PartitionWorker,
)
from bucketq.core.pings import RING_VERSION, Pings
from bucketq.core.producer import Producer
from bucketq.core.segment import Record
from bucketq.core.topics import TopicCatalog
from bucketq.core.waiting import wait_event
from bucketq.core.wake import WAKE_ACTIVE_S, WakeWatch, touch_wake
from bucketq.errors import (
    BucketqError,
    Closed,
    InvalidArgument,
    InvalidReceipt,
    LeaseLost,
    StorageError,
    TopicDeleted,
    TopicNotFound,
)
from bucketq.storage import Storage

log = logging.getLogger("bucketq.consumer")

DLQ_HEADER_PREFIX = "bucketq-dlq-"
Handler = Callable[[Message], Awaitable[object]]
# A prefetched message is handed to the app only while its durable lease has at least this long
# (or a tenth of the visibility timeout, if less) left (invariant I4: a message reaches the app
# only while its lease is durably held).

Settlement = Literal["acked", "nacked", "dead", "released at close"]
"""How this member settled a delivered message (a repeat of the same settlement is a no-op)."""


@dataclass(slots=True)
class ConsumerCounters:
    delivered: int = 0
    acked: int = 0
    nacked: int = 0
    dead_lettered: int = 0
    lease_lost: int = 0
    commits: int = 0
    conflicts: int = 0
    ops: int = 0
    commit_seconds: list[float] = field(default_factory=list)


class _TopicSub:
    """This member's view of one topic of the consumer."""

    def __init__(
        self,
        topic: str,
        partitions: int,
        membership: Membership,
        wake: WakeWatch,
        incarnation: str = "",
        active_s: float = 10.0,
    ) -> None:
        self.topic = topic
        self.wake = wake
        # the topic counts as active (partitions polled at poll_max_ms) until then (monotonic):
        # a find on any partition, or a changed wake object, extends it
        self.active_until = time.monotonic() + active_s
        # ... and it has had messages until then (a find extends it; a wake does not): heartbeats
        # keep the active cadence only while messages flow. A publish after a silence keeps the
        # topic active for WAKE_ACTIVE_S (the producer's next touch may be that far off), but a
        # lone message should not buy a minute of 5 s heartbeats and member-list LISTs
        self.busy_until = self.active_until
        self.next_wake_poll = 0.0  # wall time of this member's next turn at the wake object
        # a ping (I14) moved the next look earlier; looks caused by pings are PING_LOOK_GAP_S apart
        self.pinged = False
        self.pinged_look_at = -cadence.PING_LOOK_GAP_S  # wall time
        # the doorbell: after a ring look that found nothing (a forged or stale ring), the next
        # ring look at this topic waits until then (monotonic): a flood of forged rings costs at
        # most one GET per PING_LOOK_GAP_S, as pings do
        self.ring_gate = 0.0
        # the wake object changed on this member's turn while other members may sleep until
        # theirs: the next tick sweeps the partitions they own once (core/wake.py)
        self.sweep = False
        self.partitions = partitions
        self.owned: set[int] = set()  # the partitions this member owned at its last tick (I16)
        self.membership = membership
        self.incarnation = incarnation
        self.gone: TopicNotFound | None = None  # the topic was deleted: readers are told
        self.workers: dict[int, PartitionWorker] = {}
        self.max_deliveries: int | None = None
        self.dead_letter_topic: str | None = None


class Consumer:
    """A member of consumer group ``name`` over ``topics``. Use :meth:`poll` or :meth:`listen`."""

    def __init__(
        self,
        storage: Storage,
        keys: Keys,
        catalog: TopicCatalog,
        producer: Producer,
        settings: ConsumerSettings,
        *,
        name: str,
        consumer_id: str,
        topics: list[str],
        pings: Pings | None = None,
    ) -> None:
        self.storage = storage
        self.keys = keys
        self.catalog = catalog
        self.producer = producer
        self.settings = settings
        self.name = name
        self.id = consumer_id
        self.member = f"{consumer_id[:8]}-{token()[:12]}"
        self.topics = list(topics)
        self.counters = ConsumerCounters()
        self._subs: dict[str, _TopicSub] = {}
        self._buffer: deque[Message] = deque()
        self._held: dict[str, Message] = {}
        self._settled: dict[str, Settlement] = {}  # receipt -> how it was settled
        self._extending: set[str] = set()  # prefetched receipts with an extend in flight
        self._settling: set[str] = set()  # delivered receipts whose app call waits on a commit
        self._polling = 0  # poll() calls waiting for messages
        self._wake = asyncio.Event()
        self._arrived = asyncio.Event()
        self._looked = asyncio.Event()  # the first cycle over this member's partitions ran to its end
        self._task: asyncio.Task[None] | None = None
        self._claiming = True
        self._closed = False
        self._last_heartbeat = 0.0
        # the TTL this member's last heartbeat announced (the join's announces none: peers use
        # their own member_ttl_s); the next one is due within a third of it, whatever the cadence
        self._announced_ttl = settings.member_ttl_s
        self._last_refresh = 0.0
        self._poll_delay = cadence.poll_after_progress(settings)
        self._error: BaseException | None = None
        self.on_commit: CommitHook | None = None
        self.pings = pings
        self._unlisten: list[Callable[[], None]] = []

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        # the address producers ping (I14), advertised in every heartbeat of this member
        address = await self.pings.open() if self.pings is not None else None
        for topic in self.topics:
            marker = await self.catalog.marker(topic)
            config = marker.config
            membership = Membership(
                self.storage,
                self.keys,
                topic,
                self.name,
                self.member,
                self.settings.member_ttl_s,
                wake_address=address,
                # the member reads rings (the doorbell) and says so: producers ring it
                ping_version=RING_VERSION if address is not None else 1,
            )
            sub = _TopicSub(
                topic,
                config.partitions,
                membership,
                WakeWatch(self.storage, self.keys, topic),
                marker.incarnation,
                self.settings.idle_after_s,
            )
            self._apply_config(
                sub,
                config.dead_letter.max_deliveries if config.dead_letter.enabled else None,
                config.dead_letter_topic(topic),
            )
            self._subs[topic] = sub
            if address is not None and self.pings is not None:
                self._unlisten.append(self.pings.listen(topic, functools.partial(self._pinged, sub)))
                self._unlisten.append(self.pings.listen_rings(topic, functools.partial(self._rung, sub)))
            if sub.dead_letter_topic is not None:
                await self._ensure_dead_letter_topic(sub.dead_letter_topic)
            await membership.heartbeat()
            await membership.refresh()
            # idle members re-read the member list on their next turn (their rotation at the
            # wake object and partition ownership include this member from then on)
            await touch_wake(self.storage, self.keys, topic, self.member, "members")
            for p in range(config.partitions):
                sub.workers[p] = self._worker(sub, p)
            # load every cursor first: a partition added after the subscription began must see its
            # started siblings before it chooses a start (I5), also on a member's restart
            await asyncio.gather(*(w.log.load() for w in sub.workers.values()), return_exceptions=True)
            try:
                await self._start_cursors(sub)
            except BaseException:
                await self._leave_all()
                raise
        self._last_heartbeat = time.monotonic()
        # look at the member list again soon: members starting together then see each other
        self._last_refresh = time.monotonic() - self.settings.heartbeat_interval_s + 0.5
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"bucketq-consumer-{self.name}")

    async def _start_cursors(self, sub: _TopicSub) -> None:
        """Start every partition's cursor before the join returns (I5).

        Once ``register_consumer`` returns, the subscription's start position is fixed on every
        partition: a publish acknowledged after the join is delivered. A cursor left unstarted by a
        store failure would start later, past that publish (``latest``) or after GC collected it
        (``earliest``), so a failing store is retried here, with backoff, and the join fails with
        the store's error when it does not recover; it never returns half started.
        """
        delay = cadence.START_RETRY_FIRST_S
        for attempt in range(1, self.settings.max_commit_attempts + 1):
            pending = [w for w in sub.workers.values() if not w.loaded]
            outcomes = await asyncio.gather(*(w.ensure_loaded() for w in pending), return_exceptions=True)
            errors = [o for o in outcomes if isinstance(o, BaseException)]
            fatal = [e for e in errors if not isinstance(e, StorageError)]
            if fatal:
                raise fatal[0]
            if not errors:
                return
            if attempt == self.settings.max_commit_attempts:
                raise errors[0]
            log.warning(
                "consumer %s: starting the cursors of %s failed (attempt %d), retrying: %s",
                self.name,
                sub.topic,
                attempt,
                errors[0],
            )
            await asyncio.sleep(delay)
            delay = cadence.next_start_retry(delay)

    async def _leave_all(self) -> None:
        self._stop_listening()
        for sub in self._subs.values():
            with contextlib.suppress(StorageError):
                await sub.membership.leave()

    def _apply_config(self, sub: _TopicSub, max_deliveries: int | None, dlq: str | None) -> None:
        sub.max_deliveries = max_deliveries
        sub.dead_letter_topic = dlq

    def _worker(self, sub: _TopicSub, partition: int) -> PartitionWorker:
        def siblings_started() -> bool:  # I5: a partition added later starts at its earliest
            return any(w.state.started for p, w in sub.workers.items() if p != partition)

        return PartitionWorker(
            self.storage,
            self.keys,
            sub.topic,
            self.name,
            partition,
            self.member,
            self.settings,
            lambda: sub.max_deliveries,
            self._dead_letter,
            subscription_started=siblings_started,
            incarnation=lambda: sub.incarnation,
            topic_idle=lambda: time.monotonic() >= sub.active_until,
            # rings found segments on a partition of the topic this member owns: its producers
            # reach this member, so owned partitions no ring reaches are polled only at the rung
            # poll (cadence). A partition owned no more does not count: its rings go elsewhere.
            topic_rung=lambda now: any(
                cadence.rung_lately(w.rung_at, now) for p, w in sub.workers.items() if p in sub.owned
            ),
            # I6: the worker's cursor writes are fenced by the incarnation it was made for; a
            # re-created topic gets new workers (_refresh_topic)
            topic_fence=self.catalog.fence(sub.topic, sub.incarnation),
        )

    async def close(self, *, drain: bool = True) -> None:
        """Stop claiming; give back prefetched messages uncounted and delivered-but-unsettled ones
        counted (visible again at once); flush pending settlements; leave the group."""
        if self._closed:
            return
        self._claiming = False
        for sub in self._subs.values():
            for worker in sub.workers.values():
                worker.closing = True  # its next delta gives its standing claim back (I20)
        if drain:
            for msg in list(self._buffer):
                self._give_back(msg.receipt, counted=False)
            self._buffer.clear()
            for receipt in list(self._held):
                self._give_back(receipt)
                self._settled[receipt] = "released at close"
            self._held.clear()
            deadline = time.monotonic() + 10
            # a deleted topic's cursor logs take no more writes (I6): nothing there is waited for
            # (a standing claim's give-back there kept close() waiting its whole budget, I20)
            while any(
                w.has_work() or w.busy
                for s in self._subs.values()
                if s.gone is None
                for w in s.workers.values()
            ):
                if time.monotonic() > deadline or self._task is None or self._task.done():
                    break
                self._wake.set()
                await asyncio.sleep(0.01)
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            # asyncio.wait never raises the task's outcome, and a cancellation of close() itself
            # still propagates (suppressing CancelledError here would swallow it)
            await asyncio.wait([self._task])
            if not self._task.cancelled():
                self._task.exception()  # retrieved (poll() callers were told of a loop failure)
        # a settlement still waiting was never committed: its caller learns so (never left hanging)
        for sub in self._subs.values():
            for worker in sub.workers.values():
                worker.drop_read_ahead()
                for intent in worker.intents:
                    if not intent.future.done():
                        intent.future.set_exception(
                            Closed("consumer closed before the settlement was committed")
                        )
                worker.intents = []
        self._stop_listening()
        for sub in self._subs.values():
            await sub.membership.leave()
            await touch_wake(self.storage, self.keys, sub.topic, self.member, "members")

    def _stop_listening(self) -> None:
        for stop in self._unlisten:
            stop()
        self._unlisten.clear()

    def pause(self) -> None:
        """Stop claiming new leases (settlements still commit); :meth:`resume` undoes it.

        The next heartbeat (sent at once) asks the group for help with every partition this
        member owns, so the others take its messages while it is paused."""
        self._claiming = False
        self._last_heartbeat = 0.0
        self._wake.set()

    def resume(self) -> None:
        if not self._closed:
            self._claiming = True
            self._last_heartbeat = 0.0  # withdraw the call for help at once
            self._wake.set()

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the loop --------------------------------------------------------------------------------

    def demand(self) -> int:
        """How many leases to claim now: refill in large batches once the buffer is low."""
        if not self._claiming:
            return 0
        free = max(0, self.settings.max_in_flight - len(self._buffer) - len(self._held))
        if self._buffer and free < self.settings.max_in_flight * self.settings.refill_fraction:
            return 0
        return free

    async def _run(self) -> None:
        while not self._closed:
            failed = False
            try:
                progressed = await self._tick()
                self._looked.set()
            except asyncio.CancelledError:
                raise
            except (StorageError, BucketqError) as exc:
                log.warning("consumer %s: cycle failed, retrying: %s", self.name, exc)
                progressed, failed = False, True
                self._poll_delay = cadence.poll_after_failure(self.settings)
            except Exception as exc:  # a bug: surface it to poll() callers, keep nothing half-done
                log.exception("consumer %s loop crashed", self.name)
                self._error = exc
                self._arrived.set()
                self._looked.set()
                return
            if progressed:
                self._poll_delay = cadence.poll_after_progress(self.settings)
                continue
            self._wake.clear()
            # settlements waiting for company (PartitionWorker.settle_at) set the next tick at the latest
            # (not after a failure: the store gets poll_max_ms of rest before the retry)
            delay = cadence.loop_wait(
                self._poll_delay,
                failed=failed,
                now=time.monotonic(),
                wall=time.time(),
                settle_at=self._next_settle(),
                wake_turn=self._next_wake_turn(),
                lease_due=self._next_lease_due(),
                ring_look=self._next_ring_look(),
            )
            if not await wait_event(self._wake, delay):
                self._poll_delay = cadence.poll_backed_off(
                    self._poll_delay, cadence.poll_ceiling(self.settings, all_idle=self._all_idle())
                )

    def _all_idle(self) -> bool:
        now = time.monotonic()
        return all(now >= sub.active_until for sub in self._subs.values())

    def _all_quiet(self) -> bool:
        """No topic had messages for ``idle_after_s`` (some may still be active after a wake)."""
        now = time.monotonic()
        return all(now >= sub.busy_until for sub in self._subs.values())

    def _next_settle(self) -> float:
        """When the next batch of settlements is due (monotonic), over the topics a tick serves (a
        deleted topic's are not: they are answered when the consumer closes)."""
        return min(
            (w.settle_at() for sub in self._subs.values() if sub.gone is None for w in sub.workers.values()),
            default=float("inf"),
        )

    def _next_lease_due(self) -> float:
        """When (wall time) the next lease this member looks after comes due (I16; inf: none, or
        no room to claim it). The loop wakes then, whatever its idle cadence."""
        if self.demand() <= 0:
            return float("inf")
        return min(
            (
                w.lease_due(owned=p in sub.owned)
                for sub in self._subs.values()
                if sub.gone is None
                for p, w in sub.workers.items()
            ),
            default=float("inf"),
        )

    def _next_ring_look(self) -> float:
        """When (monotonic) a partition this member owns may be read for a ring (inf: none rung,
        or no room to claim what it would find)."""
        if self.demand() <= 0:
            return float("inf")
        return min(
            (
                max(sub.ring_gate, w.ring_look_after)
                for sub in self._subs.values()
                if sub.gone is None
                for p in sub.owned
                if (w := sub.workers.get(p)) is not None and w.ring_seq >= 0
            ),
            default=float("inf"),
        )

    def _next_wake_turn(self) -> float:
        """When (wall time) this member next looks at an idle topic's wake object (inf: none idle)."""
        now = time.monotonic()
        return min(
            (s.next_wake_poll for s in self._subs.values() if s.gone is None and now >= s.active_until),
            default=float("inf"),
        )

    async def _watch_wake(self) -> bool:
        """While a topic is idle, look at its wake object on this member's turns (one GET per topic;
        the idle members of the group take turns, core/wake.py). A change wakes every partition of
        it; True when one did (the partitions are read before anything else)."""
        now, wall = time.monotonic(), time.time()
        woke = False
        for sub in self._subs.values():
            if sub.gone is not None or now < sub.active_until or wall < sub.next_wake_poll:
                continue
            members = sub.membership.members
            rank = members.index(self.member) if self.member in members else 0
            poll_s = self.settings.wake_poll_ms / 1000
            sub.next_wake_poll = cadence.next_wake_turn(wall, poll_s, rank, len(members))
            if sub.pinged:
                sub.pinged, sub.pinged_look_at = False, wall
            why = await sub.wake.look()
            if why is not None:
                if why == "publish":
                    sub.active_until = time.monotonic() + WAKE_ACTIVE_S
                sub.sweep = len(members) > 1
                for worker in sub.workers.values():
                    worker.wake_up()
                woke = True
        return woke

    def _pinged(self, sub: _TopicSub) -> None:
        """A producer pinged ``sub``'s topic (I14): look at its wake object now, out of turn (at
        most one such look per PING_LOOK_GAP_S; a ping inside the gap is answered at its end).
        Only the time of the look changes: what it reads decides, as on any turn."""
        if self._closed or sub.gone is not None or time.monotonic() < sub.active_until:
            return  # an active topic's partitions are polled at the active cadence already
        at = cadence.ping_look_at(time.time(), sub.pinged_look_at)
        if at < sub.next_wake_poll:
            sub.next_wake_poll = at
            sub.pinged = True
        self._wake.set()

    def _rung(self, sub: _TopicSub, partition: int, seq: int) -> None:
        """A producer rang: segment ``seq`` of ``partition`` was appended (the doorbell, I14). On a
        partition this member owns, the next tick reads up to that segment through the normal
        read path (PartitionWorker.discover), so what it finds decides; a ring for a segment
        already read, or for a partition owned by another member, is dropped."""
        if self._closed or sub.gone is not None or partition not in sub.owned:
            return
        worker = sub.workers.get(partition)
        if worker is not None and worker.ring(seq):
            # the ring's read starts now if its look may happen now (the same gates as the
            # tick's ring looks: a flood of forged rings costs no more), whatever the loop is
            # doing (PartitionWorker.read_ahead)
            if self.demand() > 0 and time.monotonic() >= max(sub.ring_gate, worker.ring_look_after):
                worker.read_ahead()
            self._wake.set()

    async def _housekeeping(self) -> None:
        if await self._watch_wake():
            # read the woken partitions first; the membership and config refresh follow at the
            # next tick (the heartbeat turns to the active cadence once messages are found)
            self._last_refresh = 0.0
            self._wake.set()
            return
        now = time.monotonic()
        interval = cadence.heartbeat_interval(self.settings, all_quiet=self._all_quiet())
        # a heartbeat follows the last one within the TTL that one announced (cadence.heartbeat_due)
        if cadence.heartbeat_due(now - self._last_heartbeat, interval, self._announced_ttl):
            self._last_heartbeat = now
            ttl = cadence.heartbeat_ttl(self.settings, interval)
            landed = True
            for sub in self._subs.values():
                try:
                    await sub.membership.heartbeat(self._help_wanted(sub), ttl_s=ttl)
                except StorageError:
                    landed = False
            # a heartbeat that did not land leaves the older one (and its TTL) in force
            self._announced_ttl = ttl if landed else min(ttl, self._announced_ttl)
        if now - self._last_refresh >= cadence.refresh_interval(interval, all_idle=self._all_idle()):
            self._last_refresh = now
            for sub in self._subs.values():
                await sub.membership.refresh()
                await self._refresh_topic(sub)
        self._extend_prefetched()
        self._forget_expired()

    async def _refresh_topic(self, sub: _TopicSub) -> None:
        """Follow the topic's config; notice its deletion (readers are told) or re-creation (the
        subscription starts over on the new topic: the old cursors were purged with it)."""
        try:
            marker = await self.catalog.marker(sub.topic)
        except TopicNotFound as exc:
            if sub.gone is None:
                log.warning("consumer %s: topic %s was deleted", self.name, sub.topic)
                self._drop_topic_messages(sub.topic)
                self._fail_settlements(sub, TopicDeleted(sub.topic))
            sub.gone = exc
            self._arrived.set()
            return
        config = marker.config
        if marker.incarnation != sub.incarnation:
            log.warning(
                "consumer %s: topic %s was deleted and created again; starting over", self.name, sub.topic
            )
            self._drop_topic_messages(sub.topic)
            self._fail_settlements(sub, TopicDeleted(sub.topic, "it was deleted and created again"))
            sub.incarnation = marker.incarnation
            sub.workers = {}
            sub.partitions = 0
        sub.gone = None
        self._apply_config(
            sub,
            config.dead_letter.max_deliveries if config.dead_letter.enabled else None,
            config.dead_letter_topic(sub.topic),
        )
        for p in range(sub.partitions, config.partitions):
            sub.workers[p] = self._worker(sub, p)
        sub.partitions = config.partitions

    @staticmethod
    def _fail_settlements(sub: _TopicSub, error: TopicDeleted) -> None:
        """Settlements still waiting on the topic's old cursors: their callers learn that the
        topic is gone (they were never committed; the old cursors went with the topic)."""
        for worker in sub.workers.values():
            for intent in worker.intents:
                if not intent.future.done():
                    intent.future.set_exception(error)
            worker.intents = []

    def _drop_topic_messages(self, topic: str) -> None:
        self._buffer = deque(m for m in self._buffer if m.topic != topic)
        for receipt in [r for r, m in self._held.items() if m.topic == topic]:
            del self._held[receipt]

    def _forget_expired(self) -> None:
        """Delivered messages whose lease ran out no longer count against max_in_flight."""
        now = time.time()
        for receipt, msg in list(self._held.items()):
            if msg.lease_until < now:
                del self._held[receipt]

    def _help_wanted(self, sub: _TopicSub) -> list[int]:
        """Owned partitions with claimable messages this member is not claiming: it is saturated,
        paused (a paused member discovers nothing, so all it owns is the others' to take), or
        its cycles on the partition keep failing on the store (it is cut off from the partition's
        objects while its heartbeats still land: its leases run out and nobody else would claim)."""
        mine = [p for p in sub.membership.owned(sub.partitions) if p in sub.workers]
        if not self._claiming:
            return mine
        failing = [p for p in mine if cadence.failing(sub.workers[p].failed_cycles)]
        if self.demand() > 0:
            return failing
        return [p for p in mine if sub.workers[p].window_has_more or p in failing]

    def _extend_prefetched(self) -> None:
        """Keep leases of prefetched (not yet delivered) messages alive.

        I4: ``lease_until`` is the *durable* deadline: it moves only when the extend is committed,
        so a member paused (or slow) past its leases never hands out a message whose lease another
        member may already hold. A failed extend drops the message (it is redelivered elsewhere).
        """
        now = time.time()
        vt = self.settings.visibility_timeout_s
        for msg in self._buffer:
            if msg.lease_until - now < vt / 2 and msg.receipt not in self._extending:
                until = now + vt
                self._extending.add(msg.receipt)
                future = self._intent(Receipt.decode(msg.receipt), "extend", until=until)
                future.add_done_callback(functools.partial(self._extended, msg, until))

    def _extended(self, msg: Message, until: float, future: asyncio.Future[bool]) -> None:
        self._extending.discard(msg.receipt)
        ok = not future.cancelled() and future.exception() is None and future.result()
        if ok:
            msg.lease_until = max(msg.lease_until, until)
        elif msg in self._buffer:
            self._buffer.remove(msg)

    async def _tick(self) -> bool:
        await self._housekeeping()
        demand = self.demand()
        jobs: list[tuple[PartitionWorker, int, bool]] = []
        eager: set[PartitionWorker] = set()  # foreign jobs that claim without steal_after_s
        expired: set[PartitionWorker] = set()  # foreign jobs that claim only expired leases (I16)
        rung: set[PartitionWorker] = set()  # owned jobs that read up to a segment a ring named
        now, wall = time.monotonic(), time.time()
        for sub in self._subs.values():
            if sub.gone is not None:
                continue
            mine = set(sub.membership.owned(sub.partitions))
            # Lease liveness (I16): a partition this member just came to own (its owner left or
            # died) is read and looked at now, so the leases its owner held are known here
            for p in mine - sub.owned:
                if p in sub.workers:
                    sub.workers[p].wake_up()
            sub.owned = mine
            sweep, sub.sweep = sub.sweep, False
            for p, worker in sub.workers.items():
                settle = self._settle_due(worker, now)
                # I16: an expired lease is claimed again when it comes due, whatever the cadence
                # (an idle topic's partitions are otherwise looked at only every poll_idle_ms)
                lease_due = demand > 0 and worker.lease_due(owned=p in mine) <= wall
                if p in mine:
                    if (
                        demand > 0
                        and worker.ring_seq >= 0
                        and now >= max(sub.ring_gate, worker.ring_look_after)
                    ):
                        rung.add(worker)
                    if (
                        settle
                        or (demand > 0 and (worker.recheck or worker.discovery_due(now)))
                        or lease_due
                        or worker in rung
                    ):
                        jobs.append((worker, demand, False))
                elif settle or worker.can_give_back():
                    # (a standing claim on a partition this member no longer owns is given back
                    # at once: the new owner would wait for it to run out, I20)
                    jobs.append((worker, 0, True))
                elif demand > 0 and sweep:
                    # the topic just woke and its owner may sleep until its turn at the wake
                    # object: claim what is there now, once (ownership is affinity, claims are
                    # conditional writes: never a shared lease, I3)
                    eager.add(worker)
                    jobs.append((worker, demand, True))
                elif demand > 0 and p in sub.membership.help_wanted and now >= worker.next_foreign_poll:
                    jobs.append((worker, demand, True))  # work stealing: its owner asked for help
                elif demand > 0 and worker.watched_standing_ran_out(wall):
                    # a standing claim read at this member's join ran out (I20): what it covered
                    # may have been handed out by a holder that died, unseen in the log: read the
                    # partition and claim what is there now, once, like a sweep
                    worker.forget_watched_standing()
                    eager.add(worker)
                    jobs.append((worker, demand, True))
                elif lease_due:
                    # a lease this member looks after came due and the owner (dead, silent, or
                    # this member's view of it stale) did not take it back: claim it
                    expired.add(worker)
                    jobs.append((worker, demand, True))
        if not jobs:
            return False
        claiming = sum(1 for _, d, _ in jobs if d > 0)
        if claiming > 1:  # share the demand, so parallel partitions do not over-claim
            share = max(1, -(-demand // claiming))
            jobs = [(w, min(d, share), foreign) for w, d, foreign in jobs]
        # Every cycle runs to its end before the first failure is raised: a cycle left running
        # after gather gave up (as plain gather does) outlived close(), holding settlements it had
        # taken, which then were neither committed nor failed (simulation seed 1974).
        results = await asyncio.gather(
            *(
                self._cycle(
                    w, d, Look(foreign, self._settle_due(w, now), w in eager, w in expired, w in rung)
                )
                for w, d, foreign in jobs
            ),
            return_exceptions=True,
        )
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        progressed = False
        for (worker, demanded, foreign), res in zip(jobs, results, strict=True):
            if isinstance(res, BaseException):
                continue
            if foreign and demanded > 0:
                worker.foreign_backoff = cadence.foreign_backoff(
                    self.settings, worker.foreign_backoff, found=bool(res.messages)
                )
                worker.next_foreign_poll = time.monotonic() + worker.foreign_backoff
            if res.ring_missed:  # a ring that named no segment: the next ring look waits
                sub_rung = self._subs.get(worker.topic)
                if sub_rung is not None:
                    sub_rung.ring_gate = time.monotonic() + cadence.PING_LOOK_GAP_S
            if res.messages or res.discovered or (worker.recheck and demanded > 0):
                progressed = True
            if res.discovered or res.messages:
                sub_of = self._subs.get(worker.topic)
                if sub_of is not None:
                    sub_of.busy_until = time.monotonic() + self.settings.idle_after_s
                    sub_of.active_until = max(sub_of.active_until, sub_of.busy_until)
        if failure is not None:
            raise failure
        return progressed

    def _app_blocked(self) -> bool:
        """The app waits on its settlements and holds nothing else: no poll() waits for messages
        and every delivered message has its ack (nack, extend) waiting. Lingering for company
        then gathers nothing (a closed loop: each handler awaits its ack) and only slows it."""
        return self._polling == 0 and bool(self._settling) and self._settling.issuperset(self._held)

    def _settle_due(self, worker: PartitionWorker, now: float) -> bool:
        """Commit this worker's settlements now: their linger ran out, the app waits on them, or
        the member is closing. Otherwise they wait, riding along with the next claim delta."""
        if not worker.has_work():
            return False
        return not self._claiming or worker.settle_at() <= now or self._app_blocked()

    async def _cycle(
        self,
        worker: PartitionWorker,
        demand: int,
        look: Look,
    ) -> CycleResult:
        started = time.perf_counter()
        try:
            res = await worker.cycle(demand, look)
        except TopicDeleted:
            # the topic fence (I6) found the topic gone or re-created: look at its marker at the
            # next tick (readers are told, or the subscription starts over), write nothing more
            self._last_refresh = 0.0
            raise
        except StorageError:
            worker.failed_cycles += 1
            if cadence.ask_help_now(worker.failed_cycles, foreign=look.foreign):
                self._last_heartbeat = 0.0  # ask for help with it now
            raise
        worker.failed_cycles = 0
        elapsed = time.perf_counter() - started
        if res.ops:
            self.counters.commits += 1
            self.counters.ops += res.ops
            self.counters.conflicts += res.conflicts
            if self.on_commit is not None:
                self.on_commit(worker.topic, worker.partition, res, elapsed)
        room = self.demand()
        for msg in res.messages:
            msg._consumer = self
            if room <= 0 or not self._claiming:
                # more than we can hold (parallel partitions): give it back uncounted
                self._give_back(msg.receipt, counted=False)
                continue
            room -= 1
            self._buffer.append(msg)
        if res.messages:
            self._arrived.set()
        return res

    # -- intents ---------------------------------------------------------------------------------

    def _worker_for(self, receipt: Receipt) -> PartitionWorker:
        sub = self._subs.get(receipt.topic)
        if sub is None:
            raise TopicNotFound(receipt.topic)
        worker = sub.workers.get(receipt.partition)
        if worker is None:
            raise InvalidReceipt(receipt.encode())
        return worker

    def _intent(
        self,
        receipt: Receipt,
        kind: IntentKind,
        *,
        until: float | None = None,
        not_before: float | None = None,
        counted: bool = True,
        reason: str | None = None,
    ) -> asyncio.Future[bool]:
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        intent = Intent(
            kind, receipt, future, until=until, not_before=not_before, counted=counted, reason=reason
        )
        self._worker_for(receipt).add_intent(intent)
        self._wake.set()
        return future

    def _give_back(self, receipt: str, *, counted: bool = True) -> None:
        """Release a lease nobody awaits (prefetched or held messages at close, an over-claim):
        if the release is never committed (the consumer closed first), the lease runs out and
        the message is delivered again; its outcome is read here so it is never left unretrieved."""
        future = self._intent(Receipt.decode(receipt), "release", counted=counted)
        future.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def _settle(
        self,
        receipt_text: str,
        kind: IntentKind,
        outcome: Settlement,
        *,
        not_before: float | None = None,
        reason: str | None = None,
        counted: bool = True,
    ) -> bool:
        """Commit a settlement; False when it was already done (idempotent repeat)."""
        if self._closed:
            raise Closed("consumer is closed")
        previous = self._settled.get(receipt_text)
        if previous is not None:
            if previous == outcome:
                return False  # idempotent
            raise LeaseLost(receipt_text, f"message was already {previous}")
        receipt = Receipt.decode(receipt_text)
        self._settling.add(receipt_text)
        try:
            ok = await self._intent(receipt, kind, not_before=not_before, reason=reason, counted=counted)
        finally:
            self._settling.discard(receipt_text)
        self._held.pop(receipt_text, None)
        if not ok:
            self.counters.lease_lost += 1
            raise LeaseLost(receipt.pos)
        self._settled[receipt_text] = outcome
        if len(self._settled) > 100_000:
            for k in list(self._settled)[:50_000]:
                del self._settled[k]
        return True

    async def ack(self, receipt: str) -> None:
        """Mark the message done. Idempotent; LeaseLost when the token is stale."""
        if await self._settle(receipt, "ack", "acked"):
            self.counters.acked += 1

    async def nack(
        self, receipt: str, *, requeue: bool = True, delay: float = 0.0, reason: str = "nack"
    ) -> None:
        """Requeue (after ``delay`` seconds), or with requeue=False dead-letter the message."""
        if requeue:
            nb = time.time() + delay if delay > 0 else None
            if await self._settle(receipt, "release", "nacked", not_before=nb):
                self.counters.nacked += 1
            return
        r = Receipt.decode(receipt)
        msg = self._held.get(receipt)
        worker = self._worker_for(r)
        record = msg.record if msg is not None else worker._record(r.pos)
        if record is None:
            raise LeaseLost(r.pos, "message is no longer in this member's window")
        deliveries = worker.held_deliveries(r.pos, r.token)
        if deliveries is None:
            raise LeaseLost(r.pos)
        await self._dead_letter(r.topic, r.partition, r.pos, record, deliveries, reason)
        await self._settle(receipt, "dead", "dead", reason=reason)

    async def release(self, receipt: str) -> None:
        """Give the message back at once without counting the delivery: the app only looked at it
        (a console's ``--no-ack``) or could not start on it. Not a failure: it never moves the
        message towards its dead-letter limit. Idempotent like ``nack``."""
        await self._settle(receipt, "release", "nacked", counted=False)

    async def extend(self, receipt: str, seconds: float) -> float:
        """Keep the lease for ``seconds`` more from now; returns the new deadline."""
        if seconds <= 0:
            raise InvalidArgument("extend needs a positive number of seconds")
        until = time.time() + seconds
        r = Receipt.decode(receipt)
        if receipt in self._settled:
            raise LeaseLost(r.pos, f"message was already {self._settled[receipt]}")
        self._settling.add(receipt)
        try:
            ok = await self._intent(r, "extend", until=until)
        finally:
            self._settling.discard(receipt)
        if not ok:
            self._held.pop(receipt, None)
            self.counters.lease_lost += 1
            raise LeaseLost(r.pos)
        msg = self._held.get(receipt)
        if msg is not None:
            msg.lease_until = until
        return until

    def knows(self, receipt: str) -> bool:
        """Whether ``receipt`` is a lease this member delivered and holds, or one it settled lately.

        Lets a server refuse a forged or stale receipt before it costs a bucket request (a
        settlement of an unknown receipt would only be refused at commit time, after a write).
        """
        return receipt in self._held or receipt in self._settled

    async def _dead_letter(
        self, topic: str, partition: int, pos: Pos, record: Record, deliveries: int, reason: str
    ) -> None:
        """Publish the message into the dead-letter topic, exactly as received plus origin headers."""
        sub = self._subs[topic]
        dlq = sub.dead_letter_topic
        if dlq is None:
            return
        await self._ensure_dead_letter_topic(dlq)
        headers = dict(record.headers)
        headers.update(
            {
                f"{DLQ_HEADER_PREFIX}source-topic": topic,
                f"{DLQ_HEADER_PREFIX}partition": str(partition),
                f"{DLQ_HEADER_PREFIX}position": f"{pos[0]}:{pos[1]}",
                f"{DLQ_HEADER_PREFIX}consumer": self.name,
                f"{DLQ_HEADER_PREFIX}reason": reason,
                f"{DLQ_HEADER_PREFIX}deliveries": str(deliveries),
                f"{DLQ_HEADER_PREFIX}at": f"{time.time():.3f}",
            }
        )
        headers.pop("bucketq-redrive-for", None)
        await self.producer.publish_record(
            dlq, record, headers=headers, dedup_id=f"dlq/{topic}/{self.name}/{partition}/{pos[0]}/{pos[1]}"
        )
        self.counters.dead_lettered += 1

    async def _ensure_dead_letter_topic(self, dlq: str) -> None:
        """Create the dead-letter topic if missing (itself without a dead-letter topic)."""
        if await self.catalog.exists(dlq):
            return
        await self.catalog.create(dlq, TopicConfig(dead_letter=DeadLetterConfig(enabled=False)))

    # -- the app-facing API ----------------------------------------------------------------------

    def _check(self) -> None:
        if self._error is not None:
            raise BucketqError(f"consumer loop failed: {self._error}") from self._error
        if self._closed:
            raise Closed("consumer is closed")
        for sub in self._subs.values():
            if sub.gone is not None:
                raise TopicDeleted(sub.topic)

    async def first_look(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until this member has looked at its partitions once
        since it joined: its first cycle over them, claims included, ran to its end. True once it
        has. On a large backlog or a slow store that first look can take longer than a short
        ``poll`` wait; a caller that must not mistake it for "no messages" (``bucketq consume``)
        waits for it first."""
        self._check()
        await wait_event(self._looked, timeout)
        self._check()
        return self._looked.is_set()

    async def poll(self, max_messages: int = 10, wait: float = 1.0) -> list[Message]:
        """Up to ``max_messages`` leased messages, waiting up to ``wait`` seconds for the first."""
        self._check()
        deadline = time.monotonic() + max(0.0, wait)
        self._polling += 1  # the app waits for messages, not on its settlements (_app_blocked)
        try:
            while not self._buffer:
                self._wake.set()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._arrived.clear()
                await wait_event(self._arrived, remaining)
                self._check()
        finally:
            self._polling -= 1
        out: list[Message] = []
        now = time.time()
        margin = min(HAND_OUT_MARGIN_S, self.settings.visibility_timeout_s / 10)
        while self._buffer and len(out) < max_messages:
            msg = self._buffer.popleft()
            if msg.lease_until <= now + margin:
                continue  # I4: the durable lease ran out while prefetched: it will be redelivered
            self._held[msg.receipt] = msg
            self.counters.delivered += 1
            out.append(msg)
        if out:
            self._wake.set()  # demand changed
        return out

    async def listen(
        self, handler: Handler, *, concurrency: int = 8, stop: asyncio.Event | None = None
    ) -> None:
        """Run ``handler`` on every message; ack on return, nack on exception; leases auto-extend."""
        sem = asyncio.Semaphore(concurrency)
        tasks: set[asyncio.Task[None]] = set()
        stop = stop or asyncio.Event()
        while not stop.is_set():
            await sem.acquire()
            msgs = await self.poll(max_messages=1, wait=0.5)
            if not msgs:
                sem.release()
                continue
            task = asyncio.get_running_loop().create_task(self._handle(handler, msgs[0], sem))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _handle(self, handler: Handler, msg: Message, sem: asyncio.Semaphore) -> None:
        keeper = asyncio.get_running_loop().create_task(self._keep_alive(msg))
        try:
            try:
                await handler(msg)
            except Exception as exc:
                log.info("handler failed on %s: %s; nacking", msg.id, exc)
                keeper.cancel()
                await msg.nack(requeue=True)
            else:
                keeper.cancel()
                await msg.ack()
        except LeaseLost as exc:
            log.warning("%s", exc)
        finally:
            keeper.cancel()
            sem.release()

    async def _keep_alive(self, msg: Message) -> None:
        """Extend the lease whenever half of it is left (the extension itself takes a commit)."""
        vt = self.settings.visibility_timeout_s
        while True:
            await asyncio.sleep(max(0.05, (msg.lease_until - time.time()) - vt / 2))
            await msg.extend(vt)

    @property
    def deleted_topics(self) -> list[str]:
        """Subscribed topics found deleted (``poll`` raises TopicDeleted while any is)."""
        return [sub.topic for sub in self._subs.values() if sub.gone is not None]

    @property
    def in_flight(self) -> int:
        """Messages leased by this member: prefetched plus delivered and unsettled."""
        return len(self._buffer) + len(self._held)
