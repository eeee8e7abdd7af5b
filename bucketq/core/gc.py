"""Retention and garbage collection (docs/protocol.md). Never on the hot path: the operator runs it.

GC frees numbers in two phases, so that a number that was ever taken is never taken again
(invariant I1, ``core/fences.py``):

1. **fence**: per partition, the floor fence rises to the first segment that must be kept
   (below every started subscription's floor *and* past the topic's retention); per cursor log,
   the trim fence rises to just above the second-newest checkpoint.
2. **free**: objects below a fence are deleted only once the fence is ``grace`` old (normally in
   a later collection). Writers and readers re-read a fence they have not read for ``trust``
   (much shorter than ``grace``), so none of them can still act on a view that predates it.
   A fence's age is measured on the store's clock (its last-modified time against the store's
   time), so no host's clock, GC's included, can make a fence look old early.

Every other age that decides a deletion or an abandonment is measured on the store's clock too
(invariant I15, ``core/store_clock.py``): GC reads the store's time once per collection and
compares its own host clock with it only to warn.

A partition where any subscription has not started its cursor yet is left alone (its start
position is being decided). Also collected: stale member heartbeats, expired dedup markers,
leftover probe and csprng claim objects, objects a fenced writer left under a deleted topic,
expired pending job records (aborted, never deleted) and Spark staging nobody needs any more.

GC is not the only code that deletes (docs/architecture.md, "Where is"): deleting a topic purges
everything under it but its fences, which stay as tombstones (``TopicCatalog.delete``, I6);
deleting a subscription removes its cursors (``core/subscriptions.delete_subscription``); a Spark
write job removes its own staging area once committed (``spark/commit.py``), and a Spark redrive
its round's intent (``spark/redrive.py``). None of them deletes a segment or delta number a
writer could still take: that is GC's, through the fences.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from bucketq.core.cursor import CursorState
from bucketq.core.cursor_log import CursorLog
from bucketq.core.fences import DELTA_GRACE_S, SEGMENT_GRACE_S, FenceValue, raise_fence, read_fence
from bucketq.core.foreign import skip_foreign
from bucketq.core.keys import (
    Keys,
    heartbeat_member,
    is_dedup_key,
    is_topic_object,
    key_kind,
    seq_of,
    validate_name,
)
from bucketq.core.membership import live_heartbeats
from bucketq.core.models import TopicConfig
from bucketq.core.segment import taken_header
from bucketq.core.store_clock import CLOCK_MARGIN_S, StoreClock
from bucketq.core.topics import TopicCatalog
from bucketq.core.txn import collect_transactions
from bucketq.errors import InvalidName, StorageError, TopicNotFound
from bucketq.storage import Storage
from bucketq.storage.strategies import CLAIM_SUFFIX

# Objects under a topic prefix without a marker (left by a writer fenced off by the topic's
# deletion) are collected once this old; floor tombstones stay (they keep numbers unique).
ORPHAN_AGE_S = 3600.0


@dataclass(slots=True)
class TopicStorage:
    """A topic's stored segments at a collection. ``held_for_lagging``: segments past the topic's
    retention that GC keeps only because a subscription has not consumed them yet."""

    segments: int = 0
    bytes: int = 0
    held_for_lagging: int = 0


@dataclass(slots=True)
class GcReport:
    """What one collection deleted, by kind, and the fences it raised."""

    segments: int = 0
    deltas: int = 0
    checkpoints: int = 0
    members: int = 0
    dedup_markers: int = 0
    probes: int = 0
    claims: int = 0
    orphans: int = 0
    transactions: int = 0  # job commit records and Spark staging objects (core/txn.py)
    fences_raised: int = 0
    kept_segments_unconsumed: int = 0
    # segments freed past max retention, or for a passed subscription, before every subscription
    # consumed them (their readers skip them with an ``expire`` op, counted)
    expired_unconsumed: int = 0
    abandoned_subscriptions: list[str] = field(default_factory=list)
    # GC's host clock minus the store's (seconds; positive: the host is ahead), and whether it was
    # beyond the margin: ages are measured on the store's clock whatever this says (I15)
    clock_offset_s: float | None = None
    clock_warning: bool = False
    # what each collected topic stores after this collection (counted from the LISTs GC makes
    # anyway): the operator exports these as metrics
    stored: dict[str, TopicStorage] = field(default_factory=dict)
    deleted_keys: list[str] = field(default_factory=list)
    # objects under the collected prefixes that bucketq did not write (a ``.keep``, a README):
    # skipped, never deleted (invariant I8, core/foreign.py); how many, and which
    foreign_objects: int = 0
    foreign_keys: list[str] = field(default_factory=list)

    def foreign(self, key: str, where: str) -> None:
        """A listing met ``key``, a name bucketq does not write: skip it (logged once, counted)."""
        if key not in self.foreign_keys:
            self.foreign_keys.append(key)
            self.foreign_objects += 1
        skip_foreign(key, where)

    @property
    def total(self) -> int:
        return (
            self.segments
            + self.deltas
            + self.checkpoints
            + self.members
            + self.dedup_markers
            + self.probes
            + self.claims
            + self.orphans
            + self.transactions
        )


class _Deleter:
    def __init__(self, storage: Storage, report: GcReport) -> None:
        self.storage = storage
        self.report = report
        self.pending: list[str] = []

    async def add(self, key: str) -> None:
        self.pending.append(key)
        self.report.deleted_keys.append(key)
        if len(self.pending) >= 1000:
            await self.flush()

    async def flush(self) -> None:
        if self.pending:
            await self.storage.delete(self.pending)
            self.pending = []


async def collect_garbage(
    storage: Storage,
    keys: Keys,
    *,
    topics: list[str] | None = None,
    member_ttl_s: float = 300.0,
    dedup_window_s: float = 3600.0,
    claim_timeout_s: float = 30.0,
    delta_grace_s: float = DELTA_GRACE_S,
    segment_grace_s: float = SEGMENT_GRACE_S,
    now: float | None = None,
    clock_margin_s: float = CLOCK_MARGIN_S,
) -> GcReport:
    """Collect garbage for ``topics`` (default: every topic) plus the bucket-wide leftovers.

    Every age that decides a deletion or an abandonment — retention, heartbeats, cursor writes,
    dedup windows, fences, leftovers — is measured on the store's clock (I15): the store's time,
    read once at the start of the collection, minus the objects' Last-Modified. ``now`` (unix
    seconds) is what GC's host clock reads (default: ``time.time()``); it decides nothing, and
    is only compared with the store's: a disagreement beyond ``clock_margin_s`` is reported
    (``report.clock_warning``, a warning in the log).
    """
    report = GcReport()
    deleter = _Deleter(storage, report)
    shift = 0.0 if now is None else now - time.time()
    clock = StoreClock(
        storage, keys=keys, margin_s=clock_margin_s, host_clock=lambda: time.time() + shift, who="GC"
    )
    now = await clock.read()  # the store's time: every age below is measured from it
    report.clock_offset_s = clock.offset_s
    report.clock_warning = clock.warnings > 0
    catalog = TopicCatalog(storage, keys)
    for topic in topics if topics is not None else await catalog.names():
        try:
            marker = await catalog.marker(topic)
        except TopicNotFound:
            continue
        config = marker.config
        # cursor objects of another incarnation (a member that missed a deletion) are not this
        # topic's: loads pass them over, and trim fences are raised only above this one's (I6)
        incarnation = marker.incarnation
        fence = catalog.fence(topic, incarnation)
        consumers = await catalog.consumers(topic, foreign=report.foreign)
        logs = {
            (consumer, partition): CursorLog(
                storage, keys, topic, consumer, partition, member="gc", topic_fence=fence
            )
            for consumer in consumers
            for partition in range(config.partitions)
        }
        states = {where: await log.load() for where, log in logs.items()}
        # a folder under subs/ that holds no cursor object is no subscription (someone dropped a
        # file there): its "unstarted cursors" must not hold the topic's retention back
        for consumer in list(consumers):
            started = any(states[(consumer, p)].started for p in range(config.partitions))
            if not started and not await _holds_cursor_objects(storage, keys, topic, consumer, report):
                consumers.remove(consumer)
        last_write = {
            consumer: max(
                (t for (c, _), log in logs.items() if c == consumer and (t := log.tip_modified)), default=None
            )
            for consumer in consumers
        }
        passed = await _abandoned(storage, keys, topic, consumers, last_write, config, now, member_ttl_s)
        report.abandoned_subscriptions.extend(f"{topic}/{c}" for c in passed)
        for partition in range(config.partitions):
            floors: list[int] = []
            lagging: list[int] = []  # every started subscription's floor, passed ones included
            unstarted = False
            for consumer in consumers:
                state = states[(consumer, partition)]
                if not state.started:
                    unstarted = True
                    continue
                lagging.append(state.floor)
                if consumer not in passed:
                    floors.append(state.floor)
                await _collect_log(
                    storage, keys, topic, consumer, partition, now, delta_grace_s, deleter, incarnation
                )
            if unstarted and config.max_retention_seconds is None:
                continue  # a subscription is choosing its start position here: free nothing
            # ... except what is past the hard limit: a subscription that never starts (its first
            # member died choosing) must not hold the topic's data forever either
            await _collect_segments(
                storage,
                keys,
                topic,
                partition,
                0 if unstarted else min(floors) if floors else None,
                config.retention_seconds,
                now,
                segment_grace_s,
                deleter,
                max_retention_s=config.max_retention_seconds,
                lagging_floor=min(lagging) if lagging else None,
            )
        dedup_prefix = keys.dedup_prefix(topic)
        async for info in storage.list(dedup_prefix):
            if not is_dedup_key(info.key, dedup_prefix):
                report.foreign(info.key, f"{topic}: collecting dedup markers")
            elif now - info.last_modified > dedup_window_s:
                await deleter.add(info.key)
                report.dedup_markers += 1
        members_prefix = keys.members_topic_prefix(topic)
        async for info in storage.list(members_prefix):
            if not _is_heartbeat(info.key, members_prefix):
                report.foreign(info.key, f"{topic}: collecting member heartbeats")
            elif now - info.last_modified > member_ttl_s:
                await deleter.add(info.key)
                report.members += 1
    if topics is None:
        await _collect_deleted_topics(storage, keys, catalog, now, deleter)
    async for info in storage.list(keys.probes_prefix()):
        if not info.key.endswith(".probe") or "/" in info.key[len(keys.probes_prefix()) :]:
            report.foreign(info.key, "collecting probes")
        elif now - info.last_modified > 3600 and info.key != keys.probe("clock"):
            await deleter.add(info.key)
            report.probes += 1
    await _collect_transactions(storage, keys, catalog, topics, now, deleter)
    await deleter.flush()
    await _collect_claims(storage, keys, now, claim_timeout_s, deleter, topics)
    await deleter.flush()
    return report


async def _holds_cursor_objects(
    storage: Storage, keys: Keys, topic: str, consumer: str, report: GcReport
) -> bool:
    """Whether anything under the subscription's prefix is a cursor object bucketq wrote."""
    found = False
    async for info in storage.list(keys.subscription_prefix(topic, consumer)):
        if is_topic_object(info.key, keys.topic_prefix(topic)):
            found = True
        else:
            report.foreign(info.key, f"{topic}: listing the subscription {consumer}")
    return found


def _is_heartbeat(key: str, members_topic_prefix: str) -> bool:
    """Whether ``key`` is ``{consumer}/{member}.json`` under a topic's members prefix."""
    consumer = key[len(members_topic_prefix) :].partition("/")[0]
    try:
        validate_name(consumer, "consumer")
    except InvalidName:
        return False
    return heartbeat_member(key, f"{members_topic_prefix}{consumer}/") is not None


async def _abandoned(
    storage: Storage,
    keys: Keys,
    topic: str,
    consumers: list[str],
    last_write: dict[str, float | None],
    config: TopicConfig,
    now: float,
    member_ttl_s: float,
) -> set[str]:
    """Subscriptions of ``topic`` GC no longer waits for (I12: retention cannot be held hostage):
    inactive longer than the topic's ``subscription_timeout_seconds`` (no live member heartbeat and
    no cursor write that long).

    A subscription that is passed keeps its cursors: when it is read again, its readers find the
    collected segments below the floor fence and record an ``expire`` op that skips them, counted
    in ``collected`` (invariant I5 names this as the only way a started subscription loses
    messages). Members heartbeat while they run, idle or not, so a live group is never passed: a
    heartbeat counts while it is younger than the timeout or than the TTL its member announced
    (an idle member heartbeats only every ``heartbeat_idle_s`` and says so, I13), within GC's
    ``member_ttl_s``.

    Both ages are on the store's clock (``now`` is the store's time; ``last_write`` the store's
    Last-Modified of each subscription's newest cursor object): a cursor write's age used to be
    GC's host clock minus the ``at`` its writer stamped, and a heartbeat's GC's host clock minus
    its Last-Modified, so a GC host ahead by more than the timeout passed every live group.
    """
    timeout = config.subscription_timeout_seconds
    if timeout is None:
        return set()
    passed = set()
    for consumer in consumers:
        last = last_write.get(consumer)
        if last is not None and now - last <= timeout:
            continue
        prefix = keys.members_prefix(topic, consumer)
        if not await live_heartbeats(storage, prefix, now, timeout, max_age_s=member_ttl_s):
            passed.add(consumer)
    return passed


async def _collect_segments(
    storage: Storage,
    keys: Keys,
    topic: str,
    partition: int,
    min_floor: int | None,
    retention_s: float,
    now: float,
    grace_s: float,
    deleter: _Deleter,
    *,
    max_retention_s: float | None = None,
    lagging_floor: int | None = None,
) -> None:
    """Raise the partition's floor fence (phase 1), then free below an old enough fence (phase 2).

    A segment is kept while it is younger than ``retention_s`` or some subscription still needs
    it (``min_floor``), except that none is kept past ``max_retention_s`` (the topic's hard limit:
    no subscription can hold the topic's data hostage, I12). ``lagging_floor`` (every started
    subscription's, passed ones included) only tells which freed segments were unconsumed.
    """
    fence_key = keys.segment_floor(topic, partition)
    fence, _ = await read_fence(storage, fence_key)
    floor = fence.floor if fence is not None else 0
    new_floor, new_base = floor, fence.base if fence is not None else 0
    kept = 0
    hard_floor = floor  # below it every segment is past max_retention_s (contiguous)
    start_after = keys.segment(topic, partition, floor - 1) if floor > 0 else None
    stored = deleter.report.stored.setdefault(topic, TopicStorage())
    where = f"{topic}/p{partition}: collecting segments"
    async for info in storage.list(keys.segments_prefix(topic, partition), start_after=start_after):
        seq = seq_of(info.key, "jsonl")
        if seq is None:  # foreign: it sorts anywhere (.keep first, README.txt last), so skip it
            deleter.report.foreign(info.key, where)
            continue
        age = now - info.last_modified
        expired_hard = max_retention_s is not None and age > max_retention_s
        if expired_hard and seq == hard_floor:
            hard_floor = seq + 1
        needed = min_floor is not None and seq >= min_floor
        if not expired_hard and (age <= retention_s or needed):
            kept += 1
            stored.segments += 1
            stored.bytes += info.size
            if age > retention_s:
                stored.held_for_lagging += 1
            continue
        if seq != new_floor:
            break  # keep the freed range contiguous
        blob = await storage.get(info.key)
        if blob is None:
            break
        header = taken_header(blob.data, topic, partition, seq, new_base)
        new_floor, new_base = seq + 1, header.base + header.count
        if lagging_floor is not None and seq >= lagging_floor:
            deleter.report.expired_unconsumed += 1  # some subscription had not consumed it
    deleter.report.kept_segments_unconsumed += kept
    if new_floor > floor and await raise_fence(storage, fence_key, FenceValue(new_floor, new_base, now)):
        deleter.report.fences_raised += 1
    fence, fence_modified = await read_fence(storage, fence_key)
    if fence is None or fence_modified is None:
        return
    freeable = fence.freeable_below(fence_modified, now, grace_s)
    bound = freeable if min_floor is None else min(freeable, max(min_floor, hard_floor))
    async for info in storage.list(keys.segments_prefix(topic, partition)):
        seq = seq_of(info.key, "jsonl")
        if seq is None:
            deleter.report.foreign(info.key, where)
            continue
        if seq >= bound:
            break
        await deleter.add(info.key)
        deleter.report.segments += 1


async def _collect_log(
    storage: Storage,
    keys: Keys,
    topic: str,
    consumer: str,
    partition: int,
    now: float,
    grace_s: float,
    deleter: _Deleter,
    incarnation: str = "",
) -> None:
    """Raise the log's trim fence above the second-newest checkpoint (phase 1) and drop the older
    checkpoints; free the deltas below an old enough fence (phase 2). The checkpoint a reload
    starts from is always at or above the fence's floor minus one (the fence only rises to just
    above the second-newest checkpoint, which is kept).

    Only checkpoints a reload would use count: readable, and of this incarnation of the topic
    (I6). A checkpoint a member that missed the topic's deletion wrote into the purged prefix
    (another incarnation's state, at a number this log may not have reached) must not raise the
    fence: loads pass it over, and deltas freed below it would leave the log without a
    checkpoint that covers them."""
    fence_key = keys.log_trim(topic, consumer, partition)
    where = f"{topic}/{consumer}/p{partition}: collecting the cursor log"
    ckpts = []
    async for info in storage.list(keys.checkpoints_prefix(topic, consumer, partition)):
        n = seq_of(info.key, "json")
        if n is None:
            deleter.report.foreign(info.key, where)
        else:
            ckpts.append(n)
    ckpts.sort()
    usable: list[int] = []  # the newest two a reload would use, newest first
    for n in reversed(ckpts):
        if await _usable_checkpoint(storage, keys.checkpoint(topic, consumer, partition, n), incarnation):
            usable.append(n)
            if len(usable) == 2:
                break
    if len(usable) == 2 and await raise_fence(storage, fence_key, FenceValue(usable[1] + 1, 0, time.time())):
        deleter.report.fences_raised += 1
    # checkpoints older than the second-newest usable one are never loaded again: they go at once
    for n in ckpts:
        if len(usable) == 2 and n < usable[1]:
            await deleter.add(keys.checkpoint(topic, consumer, partition, n))
            deleter.report.checkpoints += 1
    fence, fence_modified = await read_fence(storage, fence_key)
    if fence is None or fence_modified is None:
        return
    freeable = fence.freeable_below(fence_modified, now, grace_s)
    async for info in storage.list(keys.deltas_prefix(topic, consumer, partition)):
        n = seq_of(info.key, "json")
        if n is None:
            deleter.report.foreign(info.key, where)
            continue
        if n >= freeable:
            break
        await deleter.add(info.key)
        deleter.report.deltas += 1


async def _usable_checkpoint(storage: Storage, key: str, incarnation: str) -> bool:
    """Whether a reload would use the checkpoint at ``key``: it decodes, and it is of this
    incarnation (unstamped ones match any, as in ``CursorLog``)."""
    blob = await storage.get(key)
    if blob is None:
        return False
    try:
        obj = json.loads(blob.data)
        CursorState.from_json(obj)
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    inc = obj.get("inc")
    return not (isinstance(inc, str) and inc and incarnation and inc != incarnation)


async def _collect_deleted_topics(
    storage: Storage, keys: Keys, catalog: TopicCatalog, now: float, deleter: _Deleter
) -> None:
    """Objects a fenced writer left under a topic that no longer has a marker (floor fences stay:
    they keep the topic's numbers unique if it is created again). Only what bucketq writes for a
    topic is collected: a folder at the root that is no topic's, and any object under a topic's
    prefix that is not spelled as bucketq spells its objects, belong to someone else (I8)."""
    root = keys.topics_prefix()
    for prefix in await storage.list_prefixes(root):
        name = prefix[len(root) :].rstrip("/")
        if name.startswith("_"):
            continue
        try:
            validate_name(name)
        except InvalidName:
            deleter.report.foreign(prefix, "collecting deleted topics")
            continue
        try:
            if await storage.head(keys.topic_marker(name)) is not None:
                continue
        except StorageError:
            continue
        async for info in storage.list(prefix):
            if info.key.endswith("/floor.json") or now - info.last_modified <= ORPHAN_AGE_S:
                continue
            if not is_topic_object(info.key.removesuffix(CLAIM_SUFFIX), prefix):
                deleter.report.foreign(info.key, "collecting a deleted topic's leftovers")
                continue
            await deleter.add(info.key)
            deleter.report.orphans += 1


async def _collect_transactions(
    storage: Storage,
    keys: Keys,
    catalog: TopicCatalog,
    topics: list[str] | None,
    now: float,
    deleter: _Deleter,
) -> None:
    """Job commits (core/txn.py): expired pending transactions are aborted; resolved records whose
    segments are gone, and Spark staging areas nobody needs any more, are deleted."""

    async def delete(key: str) -> None:
        await deleter.add(key)
        deleter.report.transactions += 1

    names = topics if topics is not None else await catalog.names()
    await collect_transactions(
        storage, keys, names, delete, now=now, include_staging=topics is None, foreign=deleter.report.foreign
    )


async def _collect_claims(
    storage: Storage,
    keys: Keys,
    now: float,
    claim_timeout_s: float,
    deleter: _Deleter,
    topics: list[str] | None,
) -> None:
    """csprng_verify claims left behind by crashed writers (only where that strategy is used)."""
    if storage.strategy != "csprng_verify":
        return
    prefixes = [keys.topic_prefix(t) for t in topics] if topics is not None else [keys.prefix]
    for prefix in prefixes:
        async for info in storage.list(prefix):
            if not info.key.endswith(CLAIM_SUFFIX):
                continue
            if key_kind(info.key.removesuffix(CLAIM_SUFFIX)) == "other":  # not the claim of our key
                deleter.report.foreign(info.key, "collecting csprng claims")
            elif now - info.last_modified > 10 * claim_timeout_s:
                await deleter.add(info.key)
                deleter.report.claims += 1
