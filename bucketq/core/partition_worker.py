"""One member's work on one subscription partition: discovery, claims and one delta per cycle."""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from bucketq.config import ConsumerSettings
from bucketq.core import cadence
from bucketq.core.cursor import CursorState, Op, Pos, Standing, apply_op
from bucketq.core.cursor_log import CursorLog
from bucketq.core.fences import SEGMENT_TRUST_S, FenceView
from bucketq.core.ids import token
from bucketq.core.keys import Keys
from bucketq.core.message import Message, Receipt
from bucketq.core.refsegment import header_or_stand_in, load_or_stand_in
from bucketq.core.segment import Record, Segment
from bucketq.core.subscriptions import start_cursor
from bucketq.core.topics import TopicFence
from bucketq.core.txn import txn_visibility
from bucketq.storage import Blob, Storage

log = logging.getLogger("bucketq.consumer")

REDRIVE_FOR_HEADER = "bucketq-redrive-for"
# I4: a message is handed to the app only with at least this long (and a tenth of the visibility
# timeout) left on its durable lease
HAND_OUT_MARGIN_S = 0.5
MAX_DISCOVER_PER_CYCLE = 32
MAX_WINDOW_SEGMENTS = 64
# An owner re-reads its cursor log at least this often even when it has nothing to write, so an
# op another process wrote (an operator's ``seek``) reaches a quiet group too. One GET (a 404 at
# the log's tip) per owned partition and period, only while the partition writes nothing; while
# the topic is idle, only at the fallback poll (a ``seek`` touches the wake object, core/wake.py).
LOG_REFRESH_S = 30.0
# A lease comes due this long after it may first be claimed (claims need ``until + margin < now``;
# a look at the very instant would find it not yet claimable, then count it as looked at).
LEASE_DUE_AFTER_S = 0.001
# A standing claim (format 6, I20) covers this many segments past the last one its delta sees: the
# next segments a stream brings are handed out without a claim write until the range is renewed
# (every delta the holder writes renews it)
STANDING_AHEAD = 16

DeadLetterFn = Callable[[str, int, Pos, Record, int, str], Awaitable[None]]


def seen_op(segment: Segment, consumer: str, incarnation: str = "") -> Op:
    """The ``seen`` op recording a discovered segment for ``consumer``: its size and offset, its delayed
    messages, and the redriven messages addressed to another consumer (which this one skips).

    A corrupt segment (no records) enters as an empty one; a segment written for another
    incarnation of the topic (a writer fenced off by its deletion) enters with every message
    skipped (invariant I6)."""
    h = segment.header
    if segment.hidden and h.is_reference:  # its chunks were never read: every message is skipped
        return Op("seen", h.seq, count=h.count, base=h.base, skip=list(range(h.count)))
    if not segment.records and (h.count > 0 or h.base < 0):
        return Op("seen", h.seq, count=0, base=h.base, corrupt=True)
    if incarnation and h.incarnation is not None and h.incarnation != incarnation:
        return Op("seen", h.seq, count=h.count, base=h.base, skip=list(range(h.count)))
    if segment.hidden:  # a job commit's segment its transaction does not show (core/txn.py)
        return Op("seen", h.seq, count=h.count, base=h.base, skip=list(range(h.count)))
    delayed = {i: r.not_before for i, r in enumerate(segment.records) if r.not_before}
    skip = [
        i for i, r in enumerate(segment.records) if r.headers.get(REDRIVE_FOR_HEADER) not in (None, consumer)
    ]
    return Op("seen", h.seq, count=h.count, base=h.base, delayed=delayed or None, skip=skip or None)


IntentKind = Literal["ack", "extend", "release", "dead"]
"""The cursor ops an app's request on a lease becomes (a subset of ``OpKind``)."""


@dataclass(slots=True)
class Intent:
    """An app's request on a lease, waiting for the next delta; its future gets the op's validity."""

    kind: IntentKind
    receipt: Receipt
    future: asyncio.Future[bool]
    until: float | None = None
    not_before: float | None = None
    counted: bool = True
    reason: str | None = None

    def op(self) -> Op:
        r = self.receipt
        return Op(
            self.kind,
            r.seq,
            r.idx,
            token=r.token,
            until=self.until,
            not_before=self.not_before,
            counted=self.counted,
            reason=self.reason,
            ref=self,
        )


@dataclass(slots=True)
class CycleResult:
    messages: list[Message] = field(default_factory=list)
    discovered: int = 0
    conflicts: int = 0
    ops: int = 0
    dead_lettered: int = 0  # by the janitor (max deliveries); an app's own dead-letters are its to count
    ring_missed: bool = False  # a ring look (the doorbell) did not find the segment the ring named


@dataclass(frozen=True, slots=True)
class Look:
    """What one cycle of a partition may do (:meth:`PartitionWorker.cycle` says each)."""

    foreign: bool = False
    settle: bool = True
    eager: bool = False
    expired_only: bool = False
    ring: bool = False


class PartitionWorker:
    """Owns the cursor replica of (topic, consumer, partition) for this member."""

    def __init__(
        self,
        storage: Storage,
        keys: Keys,
        topic: str,
        consumer: str,
        partition: int,
        member: str,
        settings: ConsumerSettings,
        max_deliveries: Callable[[], int | None],
        dead_letter: DeadLetterFn,
        *,
        subscription_started: Callable[[], bool] = lambda: False,
        incarnation: Callable[[], str] = lambda: "",
        topic_idle: Callable[[], bool] = lambda: False,
        topic_rung: Callable[[float], bool] = lambda now: False,
        topic_fence: TopicFence | None = None,
    ) -> None:
        self.storage = storage
        self.keys = keys
        self.topic = topic
        self.consumer = consumer
        self.partition = partition
        self.member = member
        self.settings = settings
        self.max_deliveries = max_deliveries
        self.dead_letter = dead_letter
        self.subscription_started = subscription_started
        self.incarnation = incarnation
        self.topic_idle = topic_idle
        # whether rings lately found segments on any partition of the topic here (monotonic now)
        self.topic_rung = topic_rung
        # the oldest settlement waiting for company (monotonic; None: none waits)
        self.settle_opened: float | None = None
        self.log = CursorLog(
            storage,
            keys,
            topic,
            consumer,
            partition,
            member,
            checkpoint_every=settings.checkpoint_every,
            max_attempts=settings.max_commit_attempts,
            clock_skew_s=settings.clock_skew_s,
            topic_fence=topic_fence,  # I6: its writes are fenced by the topic's incarnation
        )
        self.floor_fence = FenceView(storage, keys.segment_floor(topic, partition), SEGMENT_TRUST_S)
        self._expire_to: tuple[int, int] | None = None
        self.intents: list[Intent] = []
        self.loaded = False
        self._segments: dict[int, Segment] = {}
        self._discovered: list[Segment] = []
        self._dead_ready: dict[Pos, str] = {}
        self.next_foreign_poll = 0.0
        # consecutive cycles that failed on the store: a member cut off from this partition's
        # objects (while its heartbeats still land) asks the group for help with it
        self.failed_cycles = 0
        self.foreign_backoff = settings.foreign_poll_ms / 1000
        self.next_discovery = 0.0
        self.discovery_backoff = cadence.discovery_woken(settings)
        self.window_has_more = True
        # The doorbell (core/pings.py, I14): the highest segment a ring named that this member has not
        # read yet (-1: none), and when (monotonic) a ring last led to a find here. A ring is a
        # hint: it only makes the next cycle read the named segment through ``discover``.
        self.ring_seq = -1
        self.rung_at = float("-inf")
        self.ring_look_after = 0.0  # monotonic: rings are answered together until then
        # The GET a ring started at once (read_ahead): (the segment it reads, the request). The
        # ring's look takes its answer instead of asking again (discover, _get_segment).
        self._read_ahead: tuple[int, asyncio.Task[Blob | None]] | None = None
        self._discovering = False  # a cycle is reading segments (discover) right now
        # a committed settlement may have made a window message claimable (an ordered key's next
        # message, a release): claim again at the next tick, without a discovery GET
        self.recheck = False
        self.last_found = time.monotonic()
        # seconds between the last two arrivals, finds separated by a look that reached the tail
        # (inf: none yet; reading a backlog is not a stream): a partition receiving a stream gets
        # claim deltas that settlements can ride along with
        self.find_gap = float("inf")
        self.tail_reached = False
        self.log_read = time.monotonic()  # when the log was last read to its tip
        # Lease liveness (I16): leases of this partition that this member looks after although it
        # does not own the partition: those its replica held when it joined (their holder may have
        # died before this member's join: nobody else may know them), pos -> token
        self.watch_foreign: dict[Pos, str] = {}
        # likewise the standing claim its replica held when it joined (I20): the segments it
        # covers that the log has not seen hold no lease, only the claim, so when it runs out
        # unrenewed this member reads and claims them (its holder may be the dead owner)
        self.watch_standing: str | None = None
        # wall time of the last cycle that looked for claimable messages (expired leases
        # included): a lease that came due before it was looked at, so it is not due again until
        # something changes (a lease claimed again, or a new one)
        self.leases_looked = float("-inf")
        self._deadlines: tuple[tuple[int, int, bool], list[float]] | None = None
        # Standing claims (format 6, I20): the token of the one this worker took (None: none);
        # the positions it handed to the app under it (their ``seen`` may not be written yet: no
        # claim of this member's may take them again); since when (monotonic) segments it handed
        # out wait for their ``seen`` (None: none wait); and whether the member is leaving (its
        # next delta gives the standing claim back)
        self._stand_token: str | None = None
        self._handed: dict[Pos, float] = {}  # -> the lease deadline the app was given
        self._unseen_since: float | None = None
        # when (the take's delta time) this worker's standing claim began: the messages handed out
        # under it are leased since then (Message.leased_at: a seek that lands later replays them,
        # I11), whatever this member's replica had read when it handed them out
        self._stand_at = 0.0
        self.closing = False
        self._lock = asyncio.Lock()

    @property
    def state(self) -> CursorState:
        return self.log.state

    # -- startup ---------------------------------------------------------------------------------

    async def ensure_loaded(self) -> None:
        if self.loaded:
            return
        await start_cursor(
            self.log, self.settings.start_position, subscription_started=self.subscription_started()
        )
        self.loaded = True
        # I16: this member read the log just now; a lease in it may belong to a member that died
        # before this one joined, whose partition's owner (itself, perhaps) may never learn of it
        self.watch_foreign = {pos: lease.token for pos, lease in self.state.leases.items()}
        standing = self.state.standing
        self.watch_standing = standing.token if standing is not None else None
        self._deadlines = None

    # -- lease liveness (I16) --------------------------------------------------------------------

    def lease_due(self, *, owned: bool) -> float:
        """When (wall clock) this member should next claim an expired lease, or (an owner) a
        delayed message whose delay ended or what a standing claim that ran out covered, here;
        inf: none.

        An owner looks after every lease of its partition, at ``until + clock_skew_s`` (the margin
        I4 claims with). A non-owner looks after the leases it holds itself and those it watches
        (``watch_foreign``), ``steal_after_s`` later still: a live owner takes its own partition's
        leases back first, so a non-owner's claim meets an owner that is dead or silent. A lease
        that came due before the last cycle that looked for claimable messages is not due again.
        Deadlines are cached per state version: this runs at every tick.
        """
        state = self.log.state
        key = (id(state), state.n, owned)
        if self._deadlines is None or self._deadlines[0] != key:
            # strictly after the margin: a claim needs ``until + clock_skew_s < now`` (I4)
            margin = (
                self.settings.clock_skew_s
                + (0.0 if owned else self.settings.steal_after_s)
                + LEASE_DUE_AFTER_S
            )
            # an owner also wakes when a delayed message (a nack's back-off, a delayed publish)
            # becomes claimable: otherwise it waited for the partition's next look, which an idle
            # or un-rung partition takes only every wake or idle poll (seconds to minutes)
            delays = (
                [not_before + LEASE_DUE_AFTER_S for not_before in state.delayed.values()] if owned else []
            )
            # and when a standing claim runs out (I20): the segments it covered that the log has
            # not seen hold no lease in the state, only the claim; a holder that died after
            # handing them out left them to whoever reads them then, which an idle partition's
            # owner otherwise did only at its next poll (simulation seed 83: 20 s late)
            if state.standing is not None and (owned or self.watch_standing == state.standing.token):
                delays.append(state.standing.until + margin)
            self._deadlines = (
                key,
                sorted(
                    [
                        lease.until + margin
                        for pos, lease in state.leases.items()
                        if owned or lease.member == self.member or self.watch_foreign.get(pos) == lease.token
                    ]
                    + delays
                ),
            )
        deadlines = self._deadlines[1]
        i = bisect.bisect_right(deadlines, self.leases_looked)
        return deadlines[i] if i < len(deadlines) else float("inf")

    def watched_standing_ran_out(self, now: float) -> bool:
        """The standing claim this member watches (read at its join) ran out unrenewed, and the
        partition's owner (perhaps its dead holder) did not take it over: this member reads the
        partition and claims what it covered, once (I16, I20; a look at expired leases alone
        would not read the segments it covered that the log has not seen)."""
        st = self.state.standing
        if self.watch_standing is None or st is None or st.token != self.watch_standing:
            return False
        margin = self.settings.clock_skew_s + self.settings.steal_after_s + LEASE_DUE_AFTER_S
        return now >= st.until + margin

    def forget_watched_standing(self) -> None:
        self.watch_standing = None
        self._deadlines = None

    def _forget_watched(self, now: float, *, keep_expired: bool) -> None:
        """After a look at this partition's leases: stop watching those that are settled or taken
        again, and the expired ones this look could claim; keep those still running."""
        skew = self.settings.clock_skew_s
        self.watch_foreign = {
            pos: tok
            for pos, tok in self.watch_foreign.items()
            if (lease := self.state.leases.get(pos)) is not None
            and lease.token == tok
            and (keep_expired or lease.until + skew >= now)
        }
        self._deadlines = None

    # -- discovery -------------------------------------------------------------------------------

    def _next_seq(self) -> int:
        """The sequence number of the next segment this member has not read."""
        nxt = max(self.state.frontier, self._discovered[-1].header.seq if self._discovered else -1) + 1
        return max(nxt, self.state.floor)

    def ring(self, seq: int) -> bool:
        """A ring named segment ``seq`` of this partition: True when it is one this member has
        not read (the next cycle reads up to it), False for one already read (a duplicate, a
        reordered or a late ring: nothing to do)."""
        if not self.loaded or seq < self._next_seq():
            return False
        self.ring_seq = max(self.ring_seq, seq)
        return True

    def read_ahead(self) -> None:
        """A ring this member may answer now was accepted: start the GET of the next segment at
        once, not when the loop's next tick reads it. The tick in progress may be writing this
        partition's settlements (an ack whose linger ran out) or polling other partitions; the
        ring's read would wait for all of that, and then the claim for the read (the ack waits,
        not the claim). The ring's look (``discover``) then takes this request's answer instead
        of sending its own: the same one GET a ring costs, only sooner, and what the store
        returns decides as on any read. A read-ahead nobody takes (the segment was read
        meanwhile) is dropped; none starts while a cycle is reading this partition's segments
        (its GET of the same segment may be on the way: the ring's look follows it)."""
        if self._read_ahead is not None or self._discovering or not self.loaded:
            return
        seq = self._next_seq()
        key = self.keys.segment(self.topic, self.partition, seq)
        request = asyncio.get_running_loop().create_task(self.storage.get(key))
        request.add_done_callback(_retrieve)
        self._read_ahead = (seq, request)

    def drop_read_ahead(self) -> None:
        """The member is closing: a read nobody will take is cancelled."""
        ahead, self._read_ahead = self._read_ahead, None
        if ahead is not None:
            ahead[1].cancel()

    async def _get_segment(self, seq: int) -> Blob | None:
        """Segment ``seq``: the answer of a read-ahead of it, else a GET of its own."""
        ahead, self._read_ahead = self._read_ahead, None
        if ahead is not None and ahead[0] == seq:
            await asyncio.wait([ahead[1]])  # (never raises: the result or error is read below)
            if not ahead[1].cancelled():
                return ahead[1].result()
        return await self.storage.get(self.keys.segment(self.topic, self.partition, seq))

    async def discover(self, until: int | None = None) -> int:
        """GET the segments after the frontier until a 404 (bounded per cycle); with ``until``
        (a ring named it), at most up to that segment: no look past it for a 404.

        A 404 below the partition's floor fence means GC collected those segments before this
        subscription read them (it started while GC was freeing them): the next commit records an
        ``expire`` op that moves past them, counted (never a silent stall). The fence is read on
        a 404 at most once per half trust window.
        """
        self._discovering = True
        try:
            return await self._discover(until)
        finally:
            self._discovering = False

    async def _discover(self, until: int | None) -> int:
        found = 0
        nxt = self._next_seq()
        while found < MAX_DISCOVER_PER_CYCLE and (until is None or nxt <= until):
            blob = await self._get_segment(nxt)
            if blob is None:
                fence = await self.floor_fence.fresh()
                if nxt < fence.floor and not self._discovered:
                    self._expire_to = (fence.floor, fence.base)
                break
            header = header_or_stand_in(blob.data, self.topic, self.partition, nxt)
            hidden = False
            if header.txn is not None:
                # Job commits (core/txn.py): shown only once its transaction committed this very
                # segment; an unresolved transaction stops discovery here until it resolves.
                verdict = await txn_visibility(self.storage, self.keys, self.topic, header)
                if verdict == "wait":
                    break
                hidden = verdict == "skip"
            segment = await load_or_stand_in(
                self.storage, self.keys, blob.data, self.topic, self.partition, nxt, hidden
            )
            self._discovered.append(segment)
            found += 1
            nxt += 1
        return found

    async def _ensure_window(self) -> None:
        """Have the records of the first open segments cached (after a restart or a rebase).

        A window segment that is gone below the partition's floor fence was collected by GC
        under a retention limit (this subscription was passed as abandoned, or the topic's
        maximum retention ran out): the next commit records an ``expire`` op past the fence, so
        the messages left in it are counted in ``collected`` and the partition moves on (never
        a stall on records that no longer exist).
        """
        wanted = [s for s in sorted(self.state.segments)[:MAX_WINDOW_SEGMENTS] if s not in self._segments]
        for seq in wanted:
            blob = await self.storage.get(self.keys.segment(self.topic, self.partition, seq))
            if blob is not None:
                self._segments[seq] = await load_or_stand_in(
                    self.storage, self.keys, blob.data, self.topic, self.partition, seq
                )
                continue
            fence = await self.floor_fence.fresh()
            if seq < fence.floor and (self._expire_to is None or self._expire_to[0] < fence.floor):
                self._expire_to = (fence.floor, fence.base)
            break

    # -- the cycle -------------------------------------------------------------------------------

    def discovery_due(self, now: float) -> bool:
        return self.window_has_more or now >= self.next_discovery

    def wake_up(self) -> None:
        """The topic's wake object changed: discover and re-read the log at the next cycle."""
        self.next_discovery = 0.0
        self.discovery_backoff = cadence.discovery_woken(self.settings)
        self.log_read = float("-inf")

    def settle_at(self) -> float:
        """When the waiting settlements should be committed (monotonic; inf: none wait): dead
        letters at once, settlements as ``cadence.settle_at`` says (riding along with the claims
        of a stream of segments for at most the settlement linger)."""
        if self._dead_ready:
            return 0.0
        unseen = (
            float("inf")
            if self._unseen_since is None
            else self._unseen_since + cadence.standing_linger(self.settings)
        )
        if not self.intents:
            return unseen
        if self.settle_opened is None:
            return 0.0
        now = time.monotonic()
        linger = cadence.standing_linger(self.settings)
        # a release (a nack, a push app's RETRY) is never held for the standing delta: the
        # message's next delivery waits on its write (push retries came a standing linger, 1 s,
        # late: the first two back-off steps, 0.3-1.3 s, were both 1 s)
        releasing = any(intent.kind == "release" for intent in self.intents)
        if (
            not releasing
            and self.standing_live(time.time()) is not None
            and cadence.claims_expected(
                now=now, find_gap=self.find_gap, last_found=self.last_found, within=linger
            )
        ):
            # a stream under a standing claim: no claim delta is coming, the settlements wait
            # for the delta that writes the handed-out segments' ``seen`` (and renews the claim),
            # at most the standing linger; without a stream no company comes: at once, as below
            return min(unseen, self.settle_opened + linger)
        return min(
            unseen,
            cadence.settle_at(
                self.settings,
                self.settle_opened,
                now=time.monotonic(),
                find_gap=self.find_gap,
                last_found=self.last_found,
            ),
        )

    async def cycle(self, demand: int, look: Look = Look()) -> CycleResult:
        """One group commit: pending intents, dead letters, new segments and up to ``demand`` claims.

        On a partition another member owns (``foreign``), the member first catches up with the
        log, claims only messages that waited longer than ``steal_after_s`` (any message when
        ``eager``: the sweep of a topic that just woke; only messages whose lease expired when
        ``expired_only``: a look at leases that came due, I16), and writes nothing when it has
        nothing to claim or settle. Without ``settle`` the waiting settlements only ride along
        with a delta the cycle writes anyway (new segments, claims, dead letters). With ``ring``,
        the segments up to the one a ring named are read even when the tail poll is not due (the
        doorbell: what the store returns decides, as on any poll).
        """
        async with self._lock:
            return await self._cycle(demand, look)

    def _log_refresh_s(self) -> float:
        if self.topic_idle():
            return max(LOG_REFRESH_S, self.settings.poll_idle_ms / 1000)
        return LOG_REFRESH_S

    async def _cycle(self, demand: int, look: Look) -> CycleResult:
        foreign, settle, eager, expired_only, ring = (
            look.foreign,
            look.settle,
            look.eager,
            look.expired_only,
            look.ring,
        )
        result = CycleResult()
        looked = time.time()  # I16: every lease due by now is looked at by this cycle's claims
        if demand > 0:
            self.recheck = False
        await self.ensure_loaded()
        now = time.monotonic()
        if foreign:
            await self.log.catch_up(via_checkpoint=True)
        elif now - self.log_read >= self._log_refresh_s():
            await self.log.catch_up()
            self.log_read = now
            self._absorb_discovered()
        polled = foreign or self.discovery_due(now)
        # the doorbell: a ring named a segment not read yet: read up to that segment and no
        # further, also when the tail poll is due (the poll's look past it, a 404 that would stand
        # between the segment and its claim, waits for the poll's next turn: the slow rung poll
        # once the segment is found); what the store returns decides
        ring_to = self.ring_seq if ring and not foreign else None
        if ring:
            self.ring_seq = -1  # answered by this look, whatever it finds
            self.ring_look_after = now + cadence.ring_look_gap(self.settings)
        if ring_to is not None and ring_to < self._next_seq():
            ring_to = None  # read meanwhile by a poll
        if demand > 0 and not expired_only and (polled or ring_to is not None):
            first = self._next_seq()
            result.discovered = await self.discover(until=ring_to)
            if ring_to is not None:
                # the named segment was not there (forged, of another incarnation, or a look
                # that stopped short): the member's next ring look waits (Consumer._tick)
                result.ring_missed = first + result.discovered <= ring_to
                if result.discovered:  # what it read proves that rings arrive
                    self.rung_at = now
            if result.discovered:  # track the arrival interval: quarter on a find, double on a miss
                self.discovery_backoff = cadence.discovery_after_find(self.settings, self.discovery_backoff)
                if self.tail_reached:
                    self.find_gap = now - self.last_found
                self.last_found = now
                # ended on a 404, or on the segment a ring named (the tail, as far as it knows)
                self.tail_reached = ring_to is not None or result.discovered < MAX_DISCOVER_PER_CYCLE
                self.discovery_backoff, wait = cadence.wait_after_find(
                    self.settings,
                    self.discovery_backoff,
                    tail_reached=self.tail_reached,
                    find_gap=self.find_gap,
                    rung=cadence.rung_lately(self.rung_at, now),
                )
                self.next_discovery = now + wait
            elif ring_to is None or polled:
                # (a ring that named nothing, forged or of another incarnation, leaves the poll's
                # cadence as it was, unless the poll was due: the look was the poll's)
                self.tail_reached = True
                # the whole topic idle: only the fallback (the wake object wakes it); otherwise
                # quiet partitions are polled more slowly (the cost of an idle queue)
                self.discovery_backoff = cadence.discovery_after_miss(
                    self.settings,
                    self.discovery_backoff,
                    topic_idle=self.topic_idle(),
                    quiet_for=now - self.last_found,
                    rung=cadence.rung_lately(self.rung_at, now),
                    topic_rung=self.topic_rung(now),
                )
                self.next_discovery = now + self.discovery_backoff
        if not foreign and not expired_only:
            # a standing claim's fast path (I20): what it covers is handed out now, no claim write
            result.messages.extend(self._hand_out_unseen(demand))
        await self._ensure_window()
        if not foreign:
            await self._publish_dead_letters()
        intents, self.intents = self.intents, []
        opened_at, self.settle_opened = self.settle_opened, None
        leftover: list[bool] = [False]
        min_age = self.settings.steal_after_s if foreign and not eager else None
        leaving = foreign or self.closing
        give_back = leaving and not self._handed_unseen(time.time())
        take = (
            not leaving
            and not expired_only
            and demand > 0
            and self.tail_reached
            and not self.settings.ordered
        )

        def build(state: CursorState) -> list[Op]:
            expire = self._expire_op(state)
            if expire is not None:
                state = _preview(state, expire)
            settles = [i.op() for i in intents if not i.future.done()]
            settles.extend(Op("dead", p[0], p[1], reason=r, ref="dead") for p, r in self._dead_ready.items())
            seen = self._seen_ops(state)
            stand = self._stand_op(
                state, seen=len(seen), take=take and bool(seen), give_back=give_back, renew=not leaving
            )
            # a take or renewal goes before the delta's ``seen`` ops, so the segments it sees are
            # covered (no claim op); a give-back after them and the settlements, so what this
            # member handed out is leased to it when its ``seen`` lands and its acks are valid
            ending = stand is not None and stand.count == 0
            # a renewal of a standing claim that still lives goes after the ``seen`` ops: the
            # segments it handed out are then leased with the deadline their messages were handed
            # out under (I16 counts from it), not the renewed one
            current = state.standing
            after = (
                stand is not None
                and not ending
                and current is not None
                and current.token == stand.token
                and current.until >= time.time()
            )
            covering = _preview(state, stand) if stand is not None and not ending and not after else state
            claims, more = self._choose_claims(covering, demand, seen, min_age, expired_only=expired_only)
            leftover[0] = more
            if foreign and not claims and not settles and not (stand is not None and give_back):
                return []
            # only the ``seen`` of segments the fast path handed out waits (their messages are
            # with the app already); a covered segment it handed nothing of (corrupt, all delayed
            # or skipped, past the demand) is written now: nothing else would bring its ``seen``
            st = self.standing_live(time.time())
            handed = {pos[0] for pos in self._handed}
            deferred = st is not None and all(st.covers(op.seq) and op.seq in handed for op in seen)
            if (
                not settle
                and expire is None
                and (not seen or deferred)
                and not claims
                and not self._dead_ready
                and not (stand is not None and give_back)
            ):
                # the settlements wait for company (or for the next claim); the segments a
                # standing claim handed out wait for their ``seen`` as settlements do
                return []
            head = [op for op in (expire, None if ending or after else stand) if op is not None]
            tail = [stand] if stand is not None and (ending or after) else []
            if ending:
                assert stand is not None
                tail[:0] = self._unhanded_releases(state, [*head, *seen, *settles], stand)
            return [*head, *seen, *settles, *tail, *claims]

        outcome = None
        try:
            outcome = await self.log.commit(build)
        finally:
            back = [i for i in intents if not i.future.done()]
            self.intents[:0] = back
            if back and outcome is None and opened_at is not None:  # not written: still waiting
                self.settle_opened = min(opened_at, self.settle_opened or opened_at)
        self.window_has_more = leftover[0]
        if outcome is not None:
            self.log_read = time.monotonic()
            result.conflicts = outcome.conflicts
            result.ops = len(outcome.delta.ops)
            for op, ok in zip(outcome.delta.ops, outcome.results, strict=True):
                self._settle(op, ok, outcome.delta.at, result)
                if op.kind == "stand" and ok:
                    if op.token != self._stand_token:
                        self._stand_at = outcome.delta.at  # a take: the leases it gives begin here
                    self._stand_token = op.token if op.count > 0 else None
            if any(op.kind in ("ack", "release", "dead", "expire") for op in outcome.delta.ops):
                self.recheck = bool(self.state.segments)
            self.intents = [i for i in self.intents if not i.future.done()]
        self._absorb_discovered()
        if not foreign:
            # whatever the log now leases to this worker's standing claim and it has not handed
            # out, after any cycle, not only one that committed: a ``seen`` another member wrote
            # may come in with a catch-up (or a rebase whose segment was not in the window yet),
            # and a cycle with nothing to write would otherwise leave it leased to this member,
            # undelivered, until the lease ran out (I20)
            result.messages.extend(self._hand_out_covered(time.time()))
        if self._unseen_since is not None:
            # the handed-out segments still waiting for a ``seen`` this worker can write (a seek
            # back clears what was discovered: those wait for their discovery again)
            pending = {d.header.seq for d in self._discovered}
            if not any(pos[0] > self.state.frontier and pos[0] in pending for pos in self._handed):
                self._unseen_since = None
        if demand > 0:
            # a look that had to leave claimable messages behind (its share of the demand ran
            # out) is not a look at them: their leases stay due, and stay watched
            if not self.window_has_more:
                self.leases_looked = looked
            if foreign:
                self._forget_watched(looked, keep_expired=self.window_has_more)
        return result

    def _expire_op(self, state: CursorState) -> Op | None:
        if self._expire_to is None:
            return None
        seq, base = self._expire_to
        if seq <= state.floor:
            self._expire_to = None
            return None
        log.warning(
            "%s/%s/p%d: segments %d..%d were collected before this subscription read them; skipping",
            self.topic,
            self.consumer,
            self.partition,
            state.floor,
            seq - 1,
        )
        return Op("expire", seq, base=base)

    def _seen_ops(self, state: CursorState) -> list[Op]:
        ops = []
        expected = state.frontier + 1
        incarnation = self.incarnation()
        for seg in self._discovered:
            h = seg.header
            if h.seq < expected:
                continue
            if h.seq != expected:
                break
            op = seen_op(seg, self.consumer, incarnation)
            if op.corrupt and op.base < 0:
                op.base = state.end_offset
            ops.append(op)
            expected += 1
        return ops

    def _record(self, pos: Pos) -> Record | None:
        seg = self._segments.get(pos[0])
        if seg is None:
            for d in self._discovered:
                if d.header.seq == pos[0]:
                    seg = d
                    break
        if seg is None or pos[1] >= len(seg.records):
            return None
        return seg.records[pos[1]]

    def _choose_claims(
        self,
        state: CursorState,
        demand: int,
        ops: list[Op],
        min_age: float | None = None,
        *,
        expired_only: bool = False,
    ) -> tuple[list[Op], bool]:
        """Claims for up to ``demand`` visible positions, lowest priority first; and whether more remain.

        ``min_age`` restricts claims to messages created at least that many seconds ago;
        ``expired_only`` to messages whose lease expired (I16).
        """
        want = max(demand, 0)
        now = time.time()
        newest = now - min_age if min_age is not None else None
        skew = self.settings.clock_skew_s
        limit = self.max_deliveries()
        scan_limit = max(4 * want, 256) if want else 1  # with no demand: is anything claimable?
        ordered = self.settings.ordered
        blocked_keys: set[str] = set()
        candidates: list[tuple[int, Pos, Record]] = []
        new_segments = [
            (op.seq, op.count, set(op.skip or ()), op.delayed or {}) for op in ops if op.kind == "seen"
        ]
        standing = state.standing

        def consider(pos: Pos, record: Record, available: bool) -> None:
            if newest is not None and record.created_at > newest:
                available = False
            key = record.key if ordered else None
            if key is not None and key in blocked_keys:
                return
            if key is not None:
                blocked_keys.add(key)  # later messages of this key wait for this one
            if available:
                candidates.append((record.priority, pos, record))

        complete = True  # every open position before the new segments was considered
        for pos in state.open_positions():
            if len(candidates) >= scan_limit:
                complete = False
                break
            record = self._record(pos)
            if record is None:
                if ordered:
                    # not loaded (beyond the window): a later record of its key must not pass it
                    # (I9: per-key order holds for any number of open segments)
                    complete = False
                    break
                continue
            available = state.claimable(pos, now) and pos not in self._dead_ready
            lease = state.leases.get(pos)
            if expired_only and lease is None:
                available = False
            if available and lease is not None and lease.until + skew >= now:
                available = False  # expired, but within the clock-skew margin
            if available and limit is not None and state.prior_deliveries(pos) >= limit:
                available = False  # the janitor dead-letters it instead
            consider(pos, record, available)
        for seq, count, skip, delayed in (
            new_segments if (complete or not ordered) and not expired_only else ()
        ):
            for idx in range(count):
                if len(candidates) >= scan_limit:
                    break
                if idx in skip:
                    continue
                record = self._record((seq, idx))
                if record is None:
                    continue
                available = delayed.get(idx, 0.0) <= now and (seq, idx) not in self._handed
                if standing is not None and standing.covers(seq) and standing.until + skew >= now:
                    available = False  # leased to the standing claim's holder at ``seen`` (I20)
                # a segment seen again after a ``seek`` may hold leases kept across it (I11):
                # the same margin as above, so a lease is never shared while it may be live
                lease = state.leases.get((seq, idx))
                if lease is not None and lease.until + skew >= now:
                    available = False
                consider((seq, idx), record, available)
        candidates.sort(key=lambda c: (c[0], c[1]))
        until = now + self.settings.visibility_timeout_s
        claims = [
            Op("claim", pos[0], pos[1], token=token(), member=self.member, until=until, ref="claim")
            for _, pos, _ in candidates[:want]
        ]
        return claims, len(candidates) > want

    def dead_letter_candidates(self) -> list[tuple[Pos, int]]:
        """Positions whose deliveries reached the limit and whose lease is gone: the janitor's work."""
        limit = self.max_deliveries()
        if limit is None:
            return []
        now = time.time()
        skew = self.settings.clock_skew_s
        out = []
        for pos, lease in list(self.state.leases.items()):
            if lease.deliveries >= limit and lease.until + skew < now and pos not in self._dead_ready:
                out.append((pos, lease.deliveries))
        for pos, count in list(self.state.deliveries.items()):
            if count >= limit and pos not in self._dead_ready and self.state.claimable(pos, now):
                out.append((pos, count))
        return out

    async def _publish_dead_letters(self) -> None:
        for pos, deliveries in self.dead_letter_candidates():
            record = self._record(pos)
            if record is None:
                continue
            reason = "max_deliveries"
            await self.dead_letter(self.topic, self.partition, pos, record, deliveries, reason)
            self._dead_ready[pos] = reason

    def _settle(self, op: Op, ok: bool, at: float, result: CycleResult) -> None:
        if isinstance(op.ref, Intent):
            if not op.ref.future.done():
                op.ref.future.set_result(ok)
        elif op.ref == "dead":
            self._dead_ready.pop(op.pos, None)
            result.dead_lettered += ok
        elif op.ref == "claim" and ok:
            record = self._record(op.pos)
            lease = self.state.leases.get(op.pos)
            if record is None or lease is None or lease.token != op.token:
                return
            seg = self._segments.get(op.seq)
            base = (
                seg.header.base
                if seg
                else next((d.header.base for d in self._discovered if d.header.seq == op.seq), 0)
            )
            assert op.token is not None and op.until is not None
            receipt = Receipt(self.topic, self.partition, op.seq, op.idx, op.token)
            result.messages.append(
                Message(
                    self.topic,
                    self.partition,
                    op.seq,
                    op.idx,
                    base + op.idx,
                    record,
                    receipt.encode(),
                    lease.deliveries,
                    op.until,
                    leased_at=at,
                )
            )

    def _absorb_discovered(self) -> None:
        """Move discovered segments the state now knows into the window cache; evict done ones."""
        if self._expire_to is not None and self._expire_to[0] <= self.state.floor:
            self._expire_to = None
        if self._discovered and self._discovered[0].header.seq > self.state.frontier + 1:
            # the window moved back (a ``seek``): discovery starts again at the new frontier
            self._discovered = []
        keep = []
        for seg in self._discovered:
            if seg.header.seq <= self.state.frontier:
                if seg.header.seq >= self.state.floor:
                    self._segments[seg.header.seq] = seg
            else:
                keep.append(seg)
        self._discovered = keep
        for seq in [s for s in self._segments if s < self.state.floor]:
            del self._segments[seq]
        if self._handed:
            # handed out under the standing claim: kept while the claim never leased its segment
            # at ``seen`` (a seek may pass over it and a seek back bring it again: it is then
            # leased under the token its delivery carried, and must never be handed out again
            # under that receipt), or while it is leased under that token
            st = self.standing()
            self._handed = (
                {}
                if st is None
                else {
                    pos: until
                    for pos, until in self._handed.items()
                    if not st.leased_at_seen(pos[0])
                    or ((lease := self.state.leases.get(pos)) is not None and lease.token == st.token)
                }
            )

    def add_intent(self, intent: Intent) -> None:
        self.intents.append(intent)
        if self.settle_opened is None:
            self.settle_opened = time.monotonic()

    def has_work(self) -> bool:
        """Settlements, dead letters or the ``seen`` of handed-out segments wait to be committed."""
        return (
            bool(self.intents)
            or bool(self._dead_ready)
            or self._unseen_since is not None
            or (self.closing and self.can_give_back())
        )

    # -- standing claims (format 6, I20) -----------------------------------------------------------

    def standing(self) -> Standing | None:
        """The partition's standing claim when it is this worker's (live or not)."""
        st = self.state.standing
        if st is None or self._stand_token is None or st.token != self._stand_token:
            return None
        return st if st.member == self.member else None

    def standing_live(self, now: float) -> Standing | None:
        """This worker's standing claim when a message may be handed out under it at ``now``
        (wall clock): at least I4's hand-out margin before its durable ``until``."""
        st = self.standing()
        margin = min(HAND_OUT_MARGIN_S, self.settings.visibility_timeout_s / 10)
        return st if st is not None and st.until > now + margin else None

    def holds_standing(self) -> bool:
        """This worker's standing claim is in the log and not given back (the member must give it
        back when it stops owning the partition: the new owner would wait for it to run out)."""
        return self.standing() is not None

    def _handed_unseen(self, now: float) -> bool:
        """Messages this worker handed out under its standing claim whose segment the log has not
        seen, and whose deadline has not passed (a seek forward can pass over a segment before
        its ``seen`` is written). While there are any, the standing claim is not given back:
        ending it would let a later ``seen`` of that segment (after a seek back) lease them to
        nobody while the app still holds them. It is left to run out instead."""
        st = self.standing()
        return st is not None and any(
            until >= now and not st.leased_at_seen(pos[0]) for pos, until in self._handed.items()
        )

    def held_deliveries(self, pos: Pos, token: str) -> int | None:
        """The delivery count of the lease ``token`` holds on ``pos``, or None when it holds none
        (a settlement under it would be refused).

        I20: a message handed out under this worker's standing claim is leased to it from the
        hand-out, before its segment's ``seen`` is in the log: its settlement is written in the
        delta that writes the ``seen``, after it, or in a later one. Looking in the log alone
        refused a dead-letter (a push app's DROP) as a lost lease, and the message came back.
        """
        lease = self.state.leases.get(pos)
        if lease is not None and lease.token == token:
            return lease.deliveries
        st = self.standing()
        if st is not None and st.token == token and pos in self._handed and not st.leased_at_seen(pos[0]):
            return self.state.prior_deliveries(pos) + 1
        return None

    def _unhanded_releases(self, state: CursorState, before: list[Op], end: Op) -> list[Op]:
        """The releases that go with the end of this worker's standing claim (I20): every message
        the log leases to it (once ``before``, the delta's earlier ops, are applied) that this
        worker never handed out: a segment another member saw under it, or one its own ``seen``
        covered past the demand. Nobody else may claim such a message while the lease lives, and
        its holder will never deliver it: left alone, it waited a visibility timeout."""
        after = _preview(state, *before)
        return [
            Op("release", pos[0], pos[1], token=end.token, counted=False, ref="unhanded")
            for pos, lease in sorted(after.leases.items())
            if lease.token == end.token and pos not in self._handed
        ]

    def can_give_back(self) -> bool:
        """The member holds a standing claim it may give back now (see ``_handed_unseen``)."""
        return self.holds_standing() and not self._handed_unseen(time.time())

    def _stand_op(
        self, state: CursorState, *, seen: int, take: bool, give_back: bool, renew: bool = True
    ) -> Op | None:
        """The ``stand`` op of the delta being built, placed before its ``seen`` ops: a renewal
        of this worker's standing claim (its range reaches STANDING_AHEAD segments past what the
        delta sees, its deadline a visibility timeout from now), a take when ``take`` and none of
        another's may stand (I4's margin: only once it ran out by ``clock_skew_s``), or the
        end of its own when ``give_back``. The segments this delta sees are then covered too:
        their messages are leased at ``seen``, with no claim op."""
        now = time.time()
        until = now + self.settings.visibility_timeout_s
        end = state.frontier + 1 + seen + STANDING_AHEAD
        st = state.standing
        mine = st is not None and st.token == self._stand_token and st.member == self.member
        if mine:
            assert st is not None and self._stand_token is not None
            if give_back:
                return Op("stand", st.seq, count=0, token=self._stand_token, member=self.member)
            if not renew:
                return None  # left to run out (``_handed_unseen``)
            return Op(
                "stand",
                st.seq,
                count=max(st.count, end - st.seq),
                token=self._stand_token,
                member=self.member,
                until=until,
                ref="stand",
            )
        if not take or give_back:
            return None
        if st is not None and st.until + self.settings.clock_skew_s >= now:
            return None
        seq = state.frontier + 1
        return Op("stand", seq, count=end - seq, token=token(), member=self.member, until=until, ref="stand")

    def _hand_out_unseen(self, demand: int) -> list[Message]:
        """The fast path of a standing claim: the messages of segments read but not yet seen in
        the log, in this worker's live standing claim's range, handed out at once with no claim
        write (their ``seen`` comes later, in a batched delta). Stops at a segment the range does
        not cover, one with a possible earlier delivery (a suspect range: the ordinary path
        counts it), or once ``demand`` is met."""
        now = time.time()
        st = self.standing_live(now)
        if st is None or demand <= 0 or self._expire_to is not None or self.settings.ordered:
            return []
        state = self.state
        incarnation = self.incarnation()
        expected = state.frontier + 1
        out: list[Message] = []
        for seg in self._discovered:
            h = seg.header
            if h.seq < expected:
                continue
            if h.seq != expected or not st.covers(h.seq) or len(out) >= demand:
                break
            if any(lo <= h.seq < hi for lo, hi in state.suspect):
                break
            op = seen_op(seg, self.consumer, incarnation)
            if op.corrupt:
                break
            skip, delayed = set(op.skip or ()), op.delayed or {}
            for idx in range(op.count):
                pos = (h.seq, idx)
                if idx in skip or idx in delayed or pos in self._handed:
                    continue
                self._handed[pos] = st.until
                out.append(self._message(pos, st.token, st.until, 1, self._stand_at))
            expected += 1
        if out and self._unseen_since is None:
            self._unseen_since = time.monotonic()
        return _by_priority(out)

    def _hand_out_covered(self, now: float) -> list[Message]:
        """After every cycle: the messages the log now leases to this worker's standing claim that
        it has not handed out (segments its delta saw under the claim, or another member's
        ``seen``, read with a catch-up): they are this member's, delivered like claimed ones."""
        st = self.standing()
        if st is None:
            return []
        out = []
        for pos, lease in sorted(self.state.leases.items()):
            if lease.token != st.token or pos in self._handed or lease.until <= now:
                continue
            if not self.state.in_window(pos):
                continue  # a lease kept across a seek (I11): only what it was handed out for holds it
            if self._record(pos) is None:
                continue  # another member's ``seen``: handed out once the window has its records
            self._handed[pos] = lease.until
            out.append(self._message(pos, lease.token, lease.until, lease.deliveries, self._stand_at))
        return _by_priority(out)

    def _message(self, pos: Pos, tok: str, until: float, deliveries: int, at: float) -> Message:
        seq, idx = pos
        record = self._record(pos)
        assert record is not None
        base = self._base_of(seq)
        receipt = Receipt(self.topic, self.partition, seq, idx, tok)
        return Message(
            self.topic,
            self.partition,
            seq,
            idx,
            base + idx,
            record,
            receipt.encode(),
            deliveries,
            until,
            leased_at=at,
        )

    def _base_of(self, seq: int) -> int:
        seg = self._segments.get(seq)
        if seg is not None:
            return seg.header.base
        return next((d.header.base for d in self._discovered if d.header.seq == seq), 0)

    @property
    def busy(self) -> bool:
        """A cycle (and its commit) is in progress."""
        return self._lock.locked()


def _by_priority(messages: list[Message]) -> list[Message]:
    """Messages handed out together, lowest priority first (as claims choose them), then in order."""
    return sorted(messages, key=lambda m: (m.record.priority, m.seq, m.index))


def _retrieve(task: asyncio.Task[Blob | None]) -> None:
    """A read-ahead's error is raised where its answer is taken; one nobody takes is dropped."""
    if not task.cancelled():
        task.exception()


def _preview(state: CursorState, *ops: Op) -> CursorState:
    """The state as it will be after ``ops`` (validated the same way), for building the other ops."""
    copy = CursorState.from_json(state.to_json())
    copy.n = state.n
    now = time.time()
    for op in ops:
        apply_op(copy, op, now)
    return copy
