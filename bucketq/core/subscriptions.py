"""Creating a subscription's cursors at its start position (used by consumers and the operator)."""

from __future__ import annotations

from typing import Literal

from bucketq.core.cursor import CursorState, Op
from bucketq.core.cursor_log import CursorLog
from bucketq.core.keys import Keys, validate_name
from bucketq.core.peek import segment_at
from bucketq.core.segment import taken_header
from bucketq.core.topics import TopicCatalog, find_tail, first_segment
from bucketq.core.txn import stable_limits
from bucketq.core.wake import touch_wake
from bucketq.errors import InvalidArgument
from bucketq.storage import Storage

StartPosition = Literal["earliest", "latest"]


async def start_cursor(
    cursor: CursorLog, start_position: StartPosition, *, subscription_started: bool = False
) -> None:
    """Load the cursor; if the subscription partition never started, write its ``start`` op.

    ``earliest`` starts at the oldest segment still kept (never below the GC floor fence),
    ``latest`` after the newest one. A partition of a subscription that already started on
    another partition (``subscription_started``) was added to the topic after the subscription
    began, so every message in it is newer than the subscription: it starts at its earliest
    (invariant I5: a subscription never skips a message its start position covers).
    Concurrent starters race on delta 1; the loser adopts the winner's start.
    A cursor loaded before (a member's start loads every partition first, for I5) only catches
    up: the deltas after its tip until a 404, under the same fence checks (I2), instead of a
    second full load.
    """
    if cursor.reloads:
        await cursor.catch_up()
    else:
        await cursor.load()
    if cursor.state.started:
        return
    if start_position == "latest" and not subscription_started:
        seq, base = await find_tail(cursor.storage, cursor.keys, cursor.topic, cursor.partition)
        seq, base = await _before_pending_transactions(cursor, seq, base)
    else:
        first = await first_segment(cursor.storage, cursor.keys, cursor.topic, cursor.partition)
        seq, base = first if first is not None else (0, 0)
    start = Op("start", seq=seq, base=base)
    await cursor.commit(lambda state: [] if state.started else [start])


async def _before_pending_transactions(cursor: CursorLog, seq: int, base: int) -> tuple[int, int]:
    """A ``latest`` start moved back to the first segment of a transaction still pending.

    A job commit appends its chunks below the tail before it commits; it becomes visible after
    the subscription began, so all of it is the subscription's (all or nothing: starting at the
    tail would deliver only the chunks appended after it). Read *after* the tail: a transaction
    created later starts at or above it. Ordinary segments between the two are delivered too
    (older than the subscription, which is harmless).
    """
    limit = (await stable_limits(cursor.storage, cursor.keys, cursor.topic, abort_expired=False)).get(
        cursor.partition
    )
    if limit is None or limit >= seq:
        return seq, base
    for n in range(limit, seq):
        blob = await cursor.storage.get(cursor.keys.segment(cursor.topic, cursor.partition, n))
        if blob is None:
            continue
        header = taken_header(blob.data, cursor.topic, cursor.partition, n, -1)
        if header.base >= 0:
            return n, header.base
    return seq, base


async def init_subscription(
    storage: Storage, keys: Keys, topic: str, consumer: str, start_position: StartPosition = "earliest"
) -> list[int]:
    """Make sure every partition of ``topic`` has a started cursor for ``consumer``.

    Returns each partition's floor (the first segment the consumer will read).
    """
    validate_name(consumer, "consumer")
    catalog = TopicCatalog(storage, keys)
    marker = await catalog.marker(topic)
    config, fence = marker.config, catalog.fence(topic, marker.incarnation)  # I6: writes are fenced
    floors = []
    cursors = [
        CursorLog(storage, keys, topic, consumer, p, member="init", topic_fence=fence)
        for p in range(config.partitions)
    ]
    for cursor in cursors:
        await cursor.load()
    started = any(c.state.started for c in cursors)
    for cursor in cursors:
        await start_cursor(cursor, start_position, subscription_started=started)
        floors.append(cursor.state.floor)
    return floors


async def delete_subscription(storage: Storage, keys: Keys, topic: str, consumer: str) -> int:
    """Delete every cursor object of ``consumer`` on ``topic`` (all partitions); returns objects deleted.

    Members still running on it would start over at their start position: stop them first.
    """
    validate_name(topic)
    validate_name(consumer, "consumer")
    doomed = [info.key async for info in storage.list(keys.subscription_prefix(topic, consumer))]
    for start in range(0, len(doomed), 1000):
        await storage.delete(doomed[start : start + 1000])
    return len(doomed)


SeekTarget = Literal["earliest", "latest"] | int | float
"""Where ``seek`` moves a subscription: ``"earliest"`` (the oldest message kept), ``"latest"``
(after the newest), a partition offset (an ``int``), or a Unix time (a ``float``)."""


async def seek_subscription(
    storage: Storage,
    keys: Keys,
    topic: str,
    consumer: str,
    to: SeekTarget,
    *,
    partitions: list[int] | None = None,
) -> dict[int, tuple[int, int]]:
    """Move ``consumer``'s cursors on ``topic`` to ``to``; returns partition -> (seq, offset).

    Each partition gets one ``seek`` op in its log (a ``start`` if it never started), so every
    member agrees on the new position as soon as it reads its log (docs/protocol.md, ``seek``).
    The position is a segment: an offset or a time inside a segment starts at that segment, so up
    to one segment's earlier messages are delivered (again) too. Leases live at the seek stay the
    holders' until they end or are settled, so a seek never hands a message to a second member
    while its holder may still work on it.
    """
    validate_name(topic)
    validate_name(consumer, "consumer")
    catalog = TopicCatalog(storage, keys)
    marker = await catalog.marker(topic)
    config, fence = marker.config, catalog.fence(topic, marker.incarnation)  # I6: writes are fenced
    chosen = sorted(set(partitions)) if partitions else list(range(config.partitions))
    moved: dict[int, tuple[int, int]] = {}
    for p in chosen:
        if not 0 <= p < config.partitions:
            raise InvalidArgument(f"topic {topic!r} has partitions 0..{config.partitions - 1}, not {p}")
        if to == "latest":
            target: tuple[int, int] | None = await find_tail(storage, keys, topic, p)
        elif to == "earliest":
            target = await first_segment(storage, keys, topic, p)
        elif isinstance(to, int) and not isinstance(to, bool):
            if to < 0:
                raise InvalidArgument(f"offset must be 0 or more, got {to}")
            target = await segment_at(storage, keys, topic, p, offset=to)
        elif isinstance(to, float):
            target = await segment_at(storage, keys, topic, p, since=to)
        else:
            raise InvalidArgument(f"seek to 'earliest', 'latest', an offset or a time, not {to!r}")
        seq, base = target if target is not None else await find_tail(storage, keys, topic, p)
        cursor = CursorLog(storage, keys, topic, consumer, p, member="seek", topic_fence=fence)
        await cursor.load()

        def build(state: CursorState, seq: int = seq, base: int = base) -> list[Op]:
            return [Op("seek" if state.started else "start", seq, base=base)]

        await cursor.commit(build)
        moved[p] = (seq, base)
    # an idle group reads its logs only at the fallback poll: wake it to apply the seek now
    await touch_wake(storage, keys, topic, f"seek/{consumer}")
    return moved
