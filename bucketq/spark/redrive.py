"""Redrive bookkeeping on the dead-letter topic's cursor: claim before moving, ack once durable.

The redrive consumer (default ``redrive``) of the dead-letter topic is an ordinary subscription.
Before a batch of dead letters is copied, its positions are claimed with a long lease (so a
concurrent redrive cannot take them too); after the job commit made the copies durable in the
target topic, the same leases are acked. A crash in between leaves the leases to expire and the
positions pending: the next redrive moves them again (at least once, same message ids).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from bucketq.config import Settings
from bucketq.core.cursor import CursorState, Op
from bucketq.core.cursor_log import CursorLog
from bucketq.core.ids import token
from bucketq.core.keys import Keys
from bucketq.core.partition_worker import seen_op
from bucketq.core.segment import Segment, decode_segment
from bucketq.core.subscriptions import start_cursor
from bucketq.core.txn import txn_visibility
from bucketq.spark.planning import Pos
from bucketq.storage import Storage, open_storage

OPS_PER_DELTA = 5000


@dataclass
class Claims:
    """Leases taken on dead-letter positions, per partition: position -> lease token."""

    member: str
    tokens: dict[int, dict[Pos, str]] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(len(t) for t in self.tokens.values())


async def _seen_ops(
    storage: Storage, keys: Keys, topic: str, partition: int, first: int, last: int, consumer: str
) -> list[Op]:
    """``seen`` ops for segments ``first..last``, built like the engine's discovery builds them."""
    ops = []
    for seq in range(first, last + 1):
        blob = await storage.get(keys.segment(topic, partition, seq))
        if blob is None:
            break
        segment = decode_segment(blob.data)
        verdict = await txn_visibility(storage, keys, topic, segment.header)
        if verdict == "wait":
            break  # an unresolved job commit: the cursor does not go past it (core/txn.py)
        ops.append(seen_op(Segment(segment.header, segment.records, hidden=verdict == "skip"), consumer))
    return ops


async def _claim_partition(
    storage: Storage,
    keys: Keys,
    dlq: str,
    consumer: str,
    partition: int,
    wanted: list[Pos],
    claims: Claims,
    lease_s: float,
) -> None:
    cursor = CursorLog(storage, keys, dlq, consumer, partition, member=claims.member)
    await start_cursor(cursor, "earliest")
    seen = await _seen_ops(
        storage, keys, dlq, partition, cursor.state.frontier + 1, max(s for s, _ in wanted), consumer
    )
    until = time.time() + lease_s
    got = claims.tokens.setdefault(partition, {})
    for start in range(0, len(wanted), OPS_PER_DELTA):
        chunk = wanted[start : start + OPS_PER_DELTA]

        def build(state: CursorState, chunk: list[Pos] = chunk) -> list[Op]:
            ops = [op for op in seen if op.seq > state.frontier]
            ops += [
                Op("claim", s, i, token=token(), member=claims.member, until=until)
                for s, i in chunk
                if not state.is_done((s, i))
            ]
            return ops

        outcome = await cursor.commit(build)
        if outcome is None:
            continue
        for op, ok in zip(outcome.delta.ops, outcome.results, strict=True):
            if op.kind == "claim" and ok and op.token is not None:
                got[op.pos] = op.token


async def claim(
    settings: Settings, dlq: str, consumer: str, wanted: dict[int, list[Pos]], *, lease_s: float, member: str
) -> Claims:
    """Lease the wanted positions in ``consumer``'s cursor of ``dlq``; returns the ones we got."""
    claims = Claims(member)
    storage = await open_storage(settings)
    try:
        keys = Keys(settings.root)
        for p, positions in sorted(wanted.items()):
            if positions:
                await _claim_partition(storage, keys, dlq, consumer, p, sorted(positions), claims, lease_s)
    finally:
        await storage.close()
    return claims


async def ack(settings: Settings, dlq: str, consumer: str, claims: Claims) -> tuple[int, int]:
    """Ack every claimed position; returns (acked, lost) (lost: the lease was taken over).

    A position already done counts as acked: a round resumed after a crash may find its acks
    written before the crash.
    """
    acked = lost = 0
    storage = await open_storage(settings)
    try:
        keys = Keys(settings.root)
        for p, tokens in sorted(claims.tokens.items()):
            cursor = CursorLog(storage, keys, dlq, consumer, p, member=claims.member)
            state = await cursor.load()
            done = [pos for pos in tokens if state.is_done(pos)]
            acked += len(done)
            items = sorted((pos, tok) for pos, tok in tokens.items() if pos not in done)
            for start in range(0, len(items), OPS_PER_DELTA):
                chunk = items[start : start + OPS_PER_DELTA]
                ops = [Op("ack", s, i, token=tok) for (s, i), tok in chunk]

                def build(_state: CursorState, ops: list[Op] = ops) -> list[Op]:
                    return ops

                outcome = await cursor.commit(build)
                if outcome is not None:
                    good = sum(outcome.results)
                    acked += good
                    lost += len(ops) - good
    finally:
        await storage.close()
    return acked, lost


# -- round intents: a redrive round that dies is finished by the next run ------------------------


@dataclass
class RoundIntent:
    """A redrive round between claim and ack: its copies are write job ``job`` of ``topic``.

    Stored before the copies are written and deleted after the acks, so the next redrive finds
    the round of a run that died, writes the copies with the same job id (a no-op when they were
    committed, else exactly once) and acks the positions with the round's own lease tokens.
    """

    dlq: str
    topic: str
    consumer: str
    job: str
    claims: Claims

    def encode(self) -> bytes:
        tokens = {
            str(p): [[s, i, t] for (s, i), t in sorted(toks.items())]
            for p, toks in self.claims.tokens.items()
        }
        body = {
            "dlq": self.dlq,
            "topic": self.topic,
            "consumer": self.consumer,
            "job": self.job,
            "member": self.claims.member,
            "tokens": tokens,
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> RoundIntent:
        obj = json.loads(data)
        claims = Claims(str(obj["member"]))
        for p, items in obj["tokens"].items():
            claims.tokens[int(p)] = {(int(s), int(i)): str(t) for s, i, t in items}
        return cls(str(obj["dlq"]), str(obj["topic"]), str(obj["consumer"]), str(obj["job"]), claims)

    def key(self, keys: Keys) -> str:
        return keys.spark_intent("redrive", f"{self.dlq}/{self.consumer}/{self.job}")


async def save_intent(settings: Settings, intent: RoundIntent) -> None:
    async with await open_storage(settings) as storage:
        await storage.overwrite(intent.key(Keys(settings.root)), intent.encode())


async def drop_intent(settings: Settings, intent: RoundIntent) -> None:
    async with await open_storage(settings) as storage:
        await storage.delete([intent.key(Keys(settings.root))])


async def open_intents(settings: Settings, dlq: str, consumer: str) -> list[RoundIntent]:
    """Rounds of ``consumer`` on ``dlq`` that an earlier run started and did not finish."""
    keys = Keys(settings.root)
    out = []
    async with await open_storage(settings) as storage:
        async for info in storage.list(keys.spark_intents_prefix("redrive") + f"{dlq}/{consumer}/"):
            blob = await storage.get(info.key)
            if blob is not None:
                out.append(RoundIntent.decode(blob.data))
    return out
