"""Member heartbeats and rendezvous affinity of partitions to live members (docs/design.md 2.3)."""

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


# No heartbeat keeps a member live longer than this, whatever TTL it announced.
MAX_TTL_S = 600.0


class Membership:
    """Heartbeats of one member of one subscription, and the live member list."""

    def __init__(
        self, storage: Storage, keys: Keys, topic: str, consumer: str, member: str, ttl_s: float
    ) -> None:
        self.storage = storage
        self.keys = keys
        self.topic = topic
        self.consumer = consumer
        self.member = member
        self.ttl_s = ttl_s
        self.members: list[str] = [member]
        self.help_wanted: set[int] = set()  # partitions whose owner has more work than it can take
        self._etags: dict[str, str] = {}
        self._help_by_member: dict[str, list[int]] = {}
        self._ttl_by_member: dict[str, float] = {}

    async def heartbeat(self, help_wanted: list[int] | None = None, *, ttl_s: float | None = None) -> None:
        """Overwrite this member's heartbeat; ``help_wanted`` lists owned partitions it cannot keep
        up with; ``ttl_s`` how long peers count it live without a newer one (a quiet member
        heartbeats rarely and says so; readers take the longer of it and their own TTL)."""
        # No timestamp in the body: liveness is the object's LastModified (LIST), so an unchanged
        # heartbeat keeps its ETag and peers' refreshes skip its GET (an idle group's members
        # re-read nothing but the LIST)
        fields: dict[str, object] = {
            "member": self.member,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "help": sorted(help_wanted or []),
        }
        if ttl_s is not None:
            fields["ttl"] = ttl_s
        body = json.dumps(fields).encode()
        await self.storage.overwrite(self.keys.member(self.topic, self.consumer, self.member), body)

    async def refresh(self) -> list[str]:
        """Re-read the live members (heartbeat younger than the TTL) and the partitions they ask help
        for (a body is only fetched when its ETag changed); keeps the old view on errors."""
        prefix = self.keys.members_prefix(self.topic, self.consumer)
        now = time.time()
        try:
            # a heartbeat older than MAX_TTL_S is dead whatever it said (its body is not fetched)
            infos = [i async for i in self.storage.list(prefix) if now - i.last_modified <= MAX_TTL_S]
            help_by_member: dict[str, list[int]] = {}
            ttl_by_member: dict[str, float] = {}
            for info in infos:
                member = info.key[len(prefix) : -len(".json")]
                if member == self.member:
                    continue
                if self._etags.get(member) == info.etag:
                    help_by_member[member] = self._help_by_member.get(member, [])
                    ttl_by_member[member] = self._ttl_by_member.get(member, self.ttl_s)
                    continue
                blob = await self.storage.get(info.key)
                if blob is not None:
                    body = json.loads(blob.data)
                    help_by_member[member] = [int(p) for p in body.get("help", [])]
                    ttl_by_member[member] = min(MAX_TTL_S, float(body.get("ttl", self.ttl_s)))
                    self._etags[member] = info.etag
            infos = [
                i
                for i in infos
                if now - i.last_modified
                <= max(self.ttl_s, ttl_by_member.get(i.key[len(prefix) : -len(".json")], self.ttl_s))
            ]
        except (StorageError, ValueError, TypeError):
            return self.members
        self._ttl_by_member = ttl_by_member
        live = {info.key[len(prefix) : -len(".json")] for info in infos}
        help_by_member = {m: h for m, h in help_by_member.items() if m in live}
        self._help_by_member = help_by_member
        self.help_wanted = {p for parts in help_by_member.values() for p in parts}
        self.members = sorted({info.key[len(prefix) : -len(".json")] for info in infos} | {self.member})
        return self.members

    async def leave(self) -> None:
        try:
            await self.storage.delete([self.keys.member(self.topic, self.consumer, self.member)])
        except StorageError:
            pass
