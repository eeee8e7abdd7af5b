"""Queue statistics per topic and consumer: backlog, in flight, pending, lease holders, oldest age.

``pending`` = ``backlog`` + ``in_flight``: every message of the subscription not yet done, leased
or not (a message a member prefetched is leased, so it is in flight, never in the backlog). The
lease ``holders`` are the distinct members owning a live lease: a scaler must not remove them
while they work (docs/operator.md, "Scaling").
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from bucketq.config import ConsumerSettings
from bucketq.core.cursor import CursorState
from bucketq.core.cursor_log import CursorLog
from bucketq.core.keys import Keys
from bucketq.core.membership import live_heartbeats
from bucketq.core.refsegment import created_at_of
from bucketq.core.topics import TopicCatalog, TopicFence, find_tail
from bucketq.storage import Storage

# a member is live while its heartbeat is younger than the group's default member TTL
MEMBER_TTL_S = float(ConsumerSettings.model_fields["member_ttl_s"].default)


@dataclass(frozen=True, slots=True)
class PartitionStats:
    partition: int
    messages: int  # ever published to the partition
    backlog: int  # visible or delayed, not leased, not done
    in_flight: int  # live leases
    delayed: int
    acked: int
    dead_lettered: int
    redelivered: int
    oldest_age_s: float | None  # age of the oldest message not yet done
    last_activity: float | None = None  # Unix time of the newest delta of the cursor log it knows
    collected: int = 0  # messages skipped because GC collected them first (retention limits)
    holders: list[str] = field(default_factory=list)  # members owning a live lease, sorted

    @property
    def pending(self) -> int:
        """Messages not yet done: waiting (backlog) or leased (in flight)."""
        return self.backlog + self.in_flight


@dataclass(frozen=True, slots=True)
class SubscriptionStats:
    """One consumer's view of one topic (summed over partitions)."""

    topic: str
    consumer: str
    messages: int
    backlog: int
    in_flight: int
    delayed: int
    acked: int
    dead_lettered: int
    redelivered: int
    oldest_age_s: float | None
    partitions: list[PartitionStats]
    # live members of the group (heartbeats younger than ``member_ttl_s``) and the newest cursor
    # write of any of them: a subscription without either for long has been abandoned
    members: list[str] = field(default_factory=list)
    last_activity: float | None = None
    collected: int = 0
    # distinct members owning a live lease on any partition (a subset of who heartbeats, as far
    # as clocks agree: a member may still hold leases for a while after its heartbeat stopped)
    holders: list[str] = field(default_factory=list)

    @property
    def pending(self) -> int:
        """Messages not yet done: waiting (backlog) or leased (in flight)."""
        return self.backlog + self.in_flight

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["pending"] = self.pending
        for part, stats in zip(out["partitions"], self.partitions, strict=True):
            part["pending"] = stats.pending
        return out


async def partition_stats(
    storage: Storage, keys: Keys, topic: str, consumer: str, partition: int, fence: TopicFence | None = None
) -> PartitionStats:
    """One partition's figures; with the topic's ``fence``, cursor objects another incarnation of
    the topic left are passed over, as consumers do (I6)."""
    cursor = CursorLog(storage, keys, topic, consumer, partition, member="stats", topic_fence=fence)
    state = await cursor.load()
    _, next_offset = await find_tail(storage, keys, topic, partition)
    now = time.time()
    done_open = sum(len(s.done) for s in state.segments.values())
    live_leases = [le for le in state.leases.values() if le.until >= now]
    live = len(live_leases)
    delayed = sum(1 for t in state.delayed.values() if t > now)
    start = state.floor_offset
    outstanding = max(0, next_offset - start - done_open)
    oldest: float | None = None
    if outstanding:
        oldest = await _oldest_age(storage, keys, topic, partition, state.floor, state, now)
    return PartitionStats(
        partition=partition,
        messages=next_offset,
        backlog=max(0, outstanding - live),
        in_flight=live,
        delayed=delayed,
        acked=state.counters.acked,
        dead_lettered=state.counters.dead,
        redelivered=state.counters.redelivered,
        oldest_age_s=oldest,
        last_activity=max((at for _, at in state.ids.values()), default=None),
        collected=state.counters.collected,
        holders=sorted({le.member for le in live_leases}),
    )


async def _oldest_age(
    storage: Storage, keys: Keys, topic: str, partition: int, seq: int, state: CursorState, now: float
) -> float | None:
    blob = await storage.get(keys.segment(topic, partition, seq))
    if blob is None:
        return None
    done = state.segments[seq].done if seq in state.segments else set()
    created = await created_at_of(storage, keys, blob.data, done)
    return None if created is None else max(0.0, now - created)


async def live_members(
    storage: Storage, keys: Keys, topic: str, consumer: str, member_ttl_s: float = MEMBER_TTL_S
) -> list[str]:
    """Members of the group whose heartbeat is younger (by LIST times) than ``member_ttl_s`` or
    the ``"ttl"`` it announced (an idle member heartbeats rarely and says so; capped at MAX_TTL_S),
    as consumers count them (core/membership.py)."""
    return await live_heartbeats(storage, keys.members_prefix(topic, consumer), time.time(), member_ttl_s)


async def subscription_stats(
    storage: Storage, keys: Keys, catalog: TopicCatalog, topic: str, consumer: str
) -> SubscriptionStats:
    marker = await catalog.marker(topic)
    fence = catalog.fence(topic, marker.incarnation)
    parts = [
        await partition_stats(storage, keys, topic, consumer, p, fence)
        for p in range(marker.config.partitions)
    ]
    ages = [p.oldest_age_s for p in parts if p.oldest_age_s is not None]
    active = [p.last_activity for p in parts if p.last_activity is not None]
    return SubscriptionStats(
        topic=topic,
        consumer=consumer,
        messages=sum(p.messages for p in parts),
        backlog=sum(p.backlog for p in parts),
        in_flight=sum(p.in_flight for p in parts),
        delayed=sum(p.delayed for p in parts),
        acked=sum(p.acked for p in parts),
        dead_lettered=sum(p.dead_lettered for p in parts),
        redelivered=sum(p.redelivered for p in parts),
        oldest_age_s=max(ages) if ages else None,
        partitions=parts,
        members=await live_members(storage, keys, topic, consumer),
        last_activity=max(active) if active else None,
        collected=sum(p.collected for p in parts),
        holders=sorted({m for p in parts for m in p.holders}),
    )
