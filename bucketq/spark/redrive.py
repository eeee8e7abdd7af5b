"""Redrive bookkeeping on the dead-letter topic's cursor: claim before moving, ack once durable.

The redrive consumer (default ``redrive``) of the dead-letter topic is an ordinary subscription.
Before a batch of dead letters is copied, its positions are claimed with a long lease (so a
concurrent redrive cannot take them too); after the job commit made the copies durable in the
target topic, the same leases are acked. A crash in between leaves the leases to expire and the
positions pending: the next redrive moves them again (at least once, same message ids).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from bucketq.config import Settings
from bucketq.core.cursor_log import CursorLog
from bucketq.core.keys import Keys
from bucketq.core.redrive import ack_positions, claim_positions
from bucketq.core.subscriptions import start_cursor
from bucketq.core.topics import TopicCatalog, TopicFence
from bucketq.spark.planning import Pos
from bucketq.storage import Storage, open_storage


async def _topic_fence(storage: Storage, keys: Keys, dlq: str) -> TopicFence:
    """The dead-letter topic's fence as it is now (I6): the cursor's deltas carry its incarnation
    (format 4), a write into a topic deleted meanwhile is refused, and deltas another
    incarnation left in the prefix are passed over, as the engine's redrive does."""
    catalog = TopicCatalog(storage, keys)
    marker = await catalog.marker(dlq, fresh=True)
    return catalog.fence(dlq, marker.incarnation)


@dataclass
class Claims:
    """Leases taken on dead-letter positions, per partition: position -> lease token."""

    member: str
    tokens: dict[int, dict[Pos, str]] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(len(t) for t in self.tokens.values())


async def claim(
    settings: Settings, dlq: str, consumer: str, wanted: dict[int, list[Pos]], *, lease_s: float, member: str
) -> Claims:
    """Lease the wanted positions in ``consumer``'s cursor of ``dlq``; returns the ones we got
    (the engine's redrive does the same, core/redrive.py)."""
    claims = Claims(member)
    storage = await open_storage(settings)
    try:
        keys = Keys(settings.root)
        fence = await _topic_fence(storage, keys, dlq)
        for p, positions in sorted(wanted.items()):
            if positions:
                cursor = CursorLog(storage, keys, dlq, consumer, p, member=member, topic_fence=fence)
                await start_cursor(cursor, "earliest")
                claims.tokens[p] = await claim_positions(
                    cursor, sorted(positions), member=member, lease_s=lease_s
                )
    finally:
        await storage.close()
    return claims


async def ack(settings: Settings, dlq: str, consumer: str, claims: Claims) -> tuple[int, int]:
    """Ack every claimed position; returns (acked, lost) (lost: the lease was taken over). A
    position already done counts as acked: a round resumed after a crash may find its acks
    written before the crash."""
    acked = lost = 0
    storage = await open_storage(settings)
    try:
        keys = Keys(settings.root)
        fence = await _topic_fence(storage, keys, dlq)
        for p, tokens in sorted(claims.tokens.items()):
            cursor = CursorLog(storage, keys, dlq, consumer, p, member=claims.member, topic_fence=fence)
            good, bad = await ack_positions(cursor, tokens)
            acked += good
            lost += bad
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
