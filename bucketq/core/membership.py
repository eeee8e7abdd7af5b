"""Member heartbeats and rendezvous affinity of partitions to live members (DESIGN.md 2.3)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time

from bucketq.core.keys import Keys
from bucketq.errors import StorageError
from bucketq.storage import Storage


def rendezvous_owner(partition: int, members: list[str]) -> str | None:
    """The member with the highest SHA-256 score for the partition (highest random weight)."""
    if not members:
        return None
    return max(members, key=lambda m: hashlib.sha256(f"{m}/{partition}".encode()).digest())


def owned_partitions(member: str, members: list[str], partitions: int) -> list[int]:
    live = sorted(set(members) | {member})
    return [p for p in range(partitions) if rendezvous_owner(p, live) == member]


class Membership:
    """Heartbeats of one member of one subscription, and the live member list."""

    def __init__(self, storage: Storage, keys: Keys, topic: str, consumer: str, member: str, ttl_s: float) -> None:
        self.storage = storage
        self.keys = keys
        self.topic = topic
        self.consumer = consumer
        self.member = member
        self.ttl_s = ttl_s
        self.members: list[str] = [member]

    async def heartbeat(self) -> None:
        body = json.dumps(
            {"member": self.member, "at": time.time(), "host": socket.gethostname(), "pid": os.getpid()}
        ).encode()
        await self.storage.overwrite(self.keys.member(self.topic, self.consumer, self.member), body)

    async def refresh(self) -> list[str]:
        """Re-read the live members (heartbeat younger than the TTL); keeps the old list on errors."""
        prefix = self.keys.members_prefix(self.topic, self.consumer)
        now = time.time()
        try:
            live = [
                info.key[len(prefix) : -len(".json")]
                async for info in self.storage.list(prefix)
                if now - info.last_modified <= self.ttl_s
            ]
        except StorageError:
            return self.members
        self.members = sorted(set(live) | {self.member})
        return self.members

    async def leave(self) -> None:
        try:
            await self.storage.delete([self.keys.member(self.topic, self.consumer, self.member)])
        except StorageError:
            pass
