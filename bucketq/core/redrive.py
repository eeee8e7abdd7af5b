"""Moving dead letters back (``bucketq dlq redrive``, ``Bucketq.redrive``), without Spark.

The bookkeeping is an ordinary subscription of the dead-letter topic, ``redrive`` (the Spark
redrive uses the same one, so the two never move a dead letter twice between them):

1. select pending dead letters of that subscription that match the filter;
2. claim them with a lease (a concurrent redrive cannot take them too);
3. publish each copy into its target topic with a dedup id derived from its dead-letter position
   (``redrive/{dlq}/{partition}/{seq}/{index}``), origin headers dropped and
   ``bucketq-redrive-for: {consumer}`` added, so only the consumer that gave up on it gets it again;
4. ack the claimed positions once their copies are durable.

Invariants: a dead letter is acked in ``redrive`` only after its copy is durable (nothing is lost
by a crash); a crash between 3 and 4 leaves the lease to expire and the position pending, and the
rerun publishes it again under the same dedup id, which the target topic answers as a duplicate
within its dedup window (nothing is copied twice); dead letters that do not match the filter are
never claimed (no delivery counted, nothing else changes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bucketq.core.consumer import DLQ_HEADER_PREFIX
from bucketq.core.cursor import CursorState, Op
from bucketq.core.cursor_log import CursorLog
from bucketq.core.ids import token
from bucketq.core.keys import Keys
from bucketq.core.partition_worker import REDRIVE_FOR_HEADER, seen_op
from bucketq.core.peek import PeekedMessage, state_of, visible_segments
from bucketq.core.refsegment import header_or_stand_in, load_or_stand_in
from bucketq.core.subscriptions import start_cursor
from bucketq.core.txn import TxnResolver
from bucketq.errors import InvalidArgument
from bucketq.storage import Storage

if TYPE_CHECKING:
    from bucketq.core.app import Bucketq

REDRIVE_CONSUMER = "redrive"
SOURCE_TOPIC_HEADER = DLQ_HEADER_PREFIX + "source-topic"
ORIGIN_CONSUMER_HEADER = DLQ_HEADER_PREFIX + "consumer"
REASON_HEADER = DLQ_HEADER_PREFIX + "reason"
OPS_PER_DELTA = 1000
Pos = tuple[int, int]


@dataclass
class RedriveReport:
    """What one redrive did. ``duplicates``: copies the target already had (a resumed run)."""

    dlq: str
    selected: int = 0
    moved: int = 0
    duplicates: int = 0
    acked: int = 0
    lost: int = 0
    skipped: int = 0  # pending dead letters left alone by the filter
    targets: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "dlq": self.dlq,
            "selected": self.selected,
            "moved": self.moved,
            "duplicates": self.duplicates,
            "acked": self.acked,
            "lost": self.lost,
            "skipped": self.skipped,
            "targets": dict(self.targets),
        }


@dataclass(frozen=True)
class RedriveFilter:
    """Which dead letters to move: by source topic, failed consumer and reason (None: any)."""

    source_topic: str | None = None
    consumer: str | None = None
    reason: str | None = None

    def __call__(self, message: PeekedMessage) -> bool:
        h = message.record.headers
        return (
            (self.source_topic is None or h.get(SOURCE_TOPIC_HEADER) == self.source_topic)
            and (self.consumer is None or h.get(ORIGIN_CONSUMER_HEADER) == self.consumer)
            and (self.reason is None or h.get(REASON_HEADER) == self.reason)
        )


def redrive_headers(headers: dict[str, str]) -> dict[str, str]:
    """The copy's headers: dead-letter headers dropped, addressed to the consumer that failed."""
    out = {k: v for k, v in headers.items() if not k.startswith(DLQ_HEADER_PREFIX)}
    origin = headers.get(ORIGIN_CONSUMER_HEADER)
    if origin is not None:
        out[REDRIVE_FOR_HEADER] = origin
    return out


def redrive_dedup_id(dlq: str, partition: int, seq: int, index: int) -> str:
    """The dedup id of a dead letter's copy: the same for every run that moves it."""
    return f"redrive/{dlq}/{partition}/{seq}/{index}"


class _Pacer:
    """At most ``rate`` publishes per second (None: as fast as the store takes them)."""

    def __init__(self, rate: float | None) -> None:
        self.interval = 1.0 / rate if rate else 0.0
        self.next_at = time.monotonic()

    async def wait(self) -> None:
        if not self.interval:
            return
        now = time.monotonic()
        if self.next_at > now:
            await asyncio.sleep(self.next_at - now)
        self.next_at = max(self.next_at, now) + self.interval


async def _seen_ops(
    storage: Storage, keys: Keys, topic: str, partition: int, first: int, last: int, consumer: str
) -> list[Op]:
    """``seen`` ops for segments ``first..last``, built as the engine's discovery builds them."""
    resolver = TxnResolver(storage, keys, topic, abort_expired=False)
    ops = []
    for seq in range(first, last + 1):
        blob = await storage.get(keys.segment(topic, partition, seq))
        if blob is None:
            break
        header = header_or_stand_in(blob.data, topic, partition, seq)
        verdict = await resolver.visibility(header)
        if verdict == "wait":
            break  # an unresolved job commit: the cursor does not go past it
        segment = await load_or_stand_in(storage, keys, blob.data, topic, partition, seq, verdict == "skip")
        ops.append(seen_op(segment, consumer))
    return ops


async def claim_positions(
    cursor: CursorLog, wanted: list[Pos], *, member: str, lease_s: float
) -> dict[Pos, str]:
    """Lease the ``wanted`` positions of the cursor's partition; returns position -> token for the
    ones leased (others are done or leased elsewhere). The cursor's window is extended with
    ``seen`` ops up to the highest wanted segment first (a claim is valid only in the window)."""
    if not wanted:
        return {}
    state = await cursor.load()
    seen = await _seen_ops(
        cursor.storage,
        cursor.keys,
        cursor.topic,
        cursor.partition,
        state.frontier + 1,
        max(s for s, _ in wanted),
        cursor.consumer,
    )
    got: dict[Pos, str] = {}
    until = time.time() + lease_s
    for start in range(0, len(wanted), OPS_PER_DELTA):
        chunk = wanted[start : start + OPS_PER_DELTA]
        while True:
            tokens = {pos: token() for pos in chunk}

            def build(
                state: CursorState, chunk: list[Pos] = chunk, tokens: dict[Pos, str] = tokens
            ) -> list[Op]:
                ops = [op for op in seen if op.seq > state.frontier]
                now = time.time()
                ops += [
                    Op("claim", s, i, token=tokens[(s, i)], member=member, until=until)
                    for s, i in chunk
                    if not state.is_done((s, i)) and state.live_lease((s, i), now) is None
                ]
                return ops

            outcome = await cursor.commit(build)
            if outcome is None:
                break
            mine = {
                op.pos: op.token
                for op, ok in zip(outcome.delta.ops, outcome.results, strict=True)
                if ok and op.kind == "claim" and op.token is not None and tokens.get(op.pos) == op.token
            }
            got.update(mine)
            if mine or not any(op.kind == "claim" for op in outcome.delta.ops):
                break
            # the outcome was an earlier delta of unknown fate, resolved: build our claims again
    return got


async def ack_positions(cursor: CursorLog, tokens: dict[Pos, str]) -> tuple[int, int]:
    """Ack leased positions; returns (acked, lost). A position already done counts as acked (a
    resumed run may find its own acks written before a crash)."""
    state = await cursor.load()
    acked = sum(1 for pos in tokens if state.is_done(pos))
    items = sorted((pos, tok) for pos, tok in tokens.items() if not state.is_done(pos))
    lost = 0
    for start in range(0, len(items), OPS_PER_DELTA):
        ops = [Op("ack", s, i, token=tok) for (s, i), tok in items[start : start + OPS_PER_DELTA]]

        def build(_state: CursorState, ops: list[Op] = ops) -> list[Op]:
            return ops

        outcome = await cursor.commit(build)
        if outcome is None:
            continue
        good = sum(
            1 for op, ok in zip(outcome.delta.ops, outcome.results, strict=True) if ok and op.kind == "ack"
        )
        acked += good
        lost += len(ops) - good
    return acked, lost


async def redrive(
    bq: Bucketq,
    dlq: str,
    *,
    to: str | None = None,
    where: RedriveFilter | None = None,
    rate: float | None = None,
    limit: int | None = None,
    batch: int = 100,
    lease_s: float = 600.0,
    progress: Callable[[int], None] | None = None,
) -> RedriveReport:
    """Move pending dead letters of ``dlq`` back: into ``to``, or each into its source topic.

    ``rate`` caps publishes per second, ``limit`` the messages moved by this run. Resumable and
    idempotent (see the module docstring). Raises TopicNotFound for a missing dead-letter or
    target topic and BucketqError for a message without a source topic when ``to`` is not given.
    """
    if batch < 1:
        raise InvalidArgument(f"batch must be at least 1, got {batch}")
    if rate is not None and rate <= 0:
        raise InvalidArgument(f"rate must be positive, got {rate}")
    storage, keys, catalog = bq.storage, bq.keys, bq.catalog
    marker = await catalog.marker(dlq, fresh=True)
    if to is not None:
        await catalog.marker(to, fresh=True)  # TopicNotFound before anything is claimed
    select = where or RedriveFilter()
    report = RedriveReport(dlq)
    pacer = _Pacer(rate)
    member = f"redrive-{token()[:12]}"
    producer = await bq.register_producer("redrive")
    checked: set[str] = set()
    try:
        for p in range(marker.config.partitions):
            cursor = CursorLog(
                storage,
                keys,
                dlq,
                REDRIVE_CONSUMER,
                p,
                member=member,
                topic_fence=catalog.fence(dlq, marker.incarnation),
            )
            await start_cursor(cursor, "earliest")
            resolver = TxnResolver(storage, keys, dlq, abort_expired=False)
            chosen: list[PeekedMessage] = []
            async for segment in visible_segments(
                storage, keys, dlq, p, cursor.state.floor, marker.incarnation, resolver
            ):
                now = time.time()
                h = segment.header
                for index, record in enumerate(segment.records):
                    if state_of(cursor.state, h.seq, index, now) != "pending":
                        continue
                    message = PeekedMessage(dlq, p, h.seq, index, h.base + index, record)
                    if not select(message):
                        report.skipped += 1
                        continue
                    target = to or record.headers.get(SOURCE_TOPIC_HEADER)
                    if target is None:
                        raise InvalidArgument(
                            f"dead letter {dlq} p{p} offset {message.offset} names no source topic: "
                            "give the target topic (--to)"
                        )
                    if target not in checked:
                        await catalog.marker(target, fresh=True)
                        checked.add(target)
                    chosen.append(message)
                    if limit is not None and report.selected + len(chosen) >= limit:
                        break
                    if len(chosen) >= batch:
                        await _move(cursor, chosen, to, producer, pacer, member, lease_s, report, progress)
                        chosen = []
                if limit is not None and report.selected + len(chosen) >= limit:
                    break
            if chosen:
                await _move(cursor, chosen, to, producer, pacer, member, lease_s, report, progress)
            if limit is not None and report.selected >= limit:
                break
    finally:
        await producer.close()
    return report


async def _move(
    cursor: CursorLog,
    chosen: list[PeekedMessage],
    to: str | None,
    producer: Any,
    pacer: _Pacer,
    member: str,
    lease_s: float,
    report: RedriveReport,
    progress: Callable[[int], None] | None,
) -> None:
    """Claim, copy and ack one batch of one partition."""
    report.selected += len(chosen)
    tokens = await claim_positions(cursor, [(m.seq, m.index) for m in chosen], member=member, lease_s=lease_s)
    copied: dict[Pos, str] = {}
    for m in chosen:
        tok = tokens.get((m.seq, m.index))
        if tok is None:
            continue  # taken by a concurrent redrive, or done meanwhile
        target = to or m.record.headers[SOURCE_TOPIC_HEADER]
        await pacer.wait()
        result = await producer.publish_record(
            target,
            m.record,
            headers=redrive_headers(dict(m.record.headers)),
            dedup_id=redrive_dedup_id(m.topic, m.partition, m.seq, m.index),
        )
        if result.duplicate:
            report.duplicates += 1
        else:
            report.moved += 1
        report.targets[target] = report.targets.get(target, 0) + 1
        copied[(m.seq, m.index)] = tok
        if progress is not None:
            progress(1)
    acked, lost = await ack_positions(cursor, copied)
    report.acked += acked
    report.lost += lost
