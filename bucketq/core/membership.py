"""Member heartbeats and rendezvous affinity of partitions to live members (docs/design.md 2.3)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import time

from bucketq.core.foreign import skip_foreign
from bucketq.core.keys import Keys, heartbeat_member
from bucketq.errors import StorageError
from bucketq.storage import Storage

# The assignment scheme a heartbeat announces (``"assign"``). A group uses the balanced scheme once
# every live member announces it; while any member does not (an older release during a rolling
# upgrade), all of them use plain rendezvous, so members of both releases agree on the owners.
BALANCED = "balanced"


def _score(member: str, partition: int) -> bytes:
    return hashlib.sha256(f"{member}/{partition}".encode()).digest()


def rendezvous_owner(partition: int, members: list[str]) -> str | None:
    """The member with the highest SHA-256 score for the partition (highest random weight)."""
    if not members:
        return None
    return max(members, key=lambda m: _score(m, partition))


@functools.lru_cache(maxsize=64)
def balanced_owners(members: tuple[str, ...], partitions: int) -> tuple[str, ...]:
    """The owner of each partition: rendezvous scores, with every member's load bounded.

    Each member owns ``partitions // len(members)`` partitions, and ``partitions % len(members)``
    of them one more: (member, partition) pairs are taken in descending score order while the
    member has room. So with as many partitions as members each member owns one (plain
    rendezvous leaves a member without any in most groups: 4 members on 4 partitions all get one
    in only 9 % of groups), and a change of membership moves few partitions (scores decide).
    """
    if not members or partitions <= 0:
        return ()
    floor, extra = divmod(partitions, len(members))
    pairs = sorted(((_score(m, p), m, p) for m in members for p in range(partitions)), reverse=True)
    owners: dict[int, str] = {}
    load: dict[str, int] = dict.fromkeys(members, 0)
    for _, member, partition in pairs:
        if partition in owners:
            continue
        if load[member] < floor:
            pass
        elif load[member] == floor and extra > 0:
            extra -= 1
        else:
            continue
        owners[partition] = member
        load[member] += 1
    return tuple(owners[p] for p in range(partitions))


def owned_partitions(
    member: str, members: list[str], partitions: int, *, balanced: bool = False
) -> list[int]:
    """The partitions ``member`` polls as their owner (affinity only: claims are conditional writes)."""
    live = sorted(set(members) | {member})
    if balanced:
        owners = balanced_owners(tuple(live), partitions)
        return [p for p, owner in enumerate(owners) if owner == member]
    return [p for p in range(partitions) if rendezvous_owner(p, live) == member]


# No heartbeat keeps a member live longer than this, whatever TTL it announced.
MAX_TTL_S = 600.0


async def announced_ttl(storage: Storage, key: str) -> float:
    """How long the heartbeat at ``key`` says its member stays live without a newer one (``"ttl"``,
    capped at MAX_TTL_S); 0 when it says nothing or cannot be read."""
    blob = await storage.get(key)
    try:
        ttl = float(json.loads(blob.data).get("ttl", 0.0)) if blob is not None else 0.0
    except (ValueError, TypeError, AttributeError):
        ttl = 0.0
    return min(max(ttl, 0.0), MAX_TTL_S)


async def live_heartbeats(
    storage: Storage, prefix: str, now: float, ttl_s: float, *, max_age_s: float = MAX_TTL_S
) -> list[str]:
    """The members under ``prefix`` whose heartbeat, at ``now`` (by LIST times), is at most
    ``max_age_s`` old and younger than ``ttl_s`` or than the ``"ttl"`` it announced (an idle
    member heartbeats rarely and says so); the body is read only for heartbeats older than
    ``ttl_s``."""
    live = []
    async for info in storage.list(prefix):
        member = heartbeat_member(info.key, prefix)
        if member is None:
            skip_foreign(info.key, "counting live members")
            continue
        age = now - info.last_modified
        if age > max_age_s:
            continue
        if age > ttl_s and age > await announced_ttl(storage, info.key):
            continue
        live.append(member)
    return sorted(live)


def _heartbeat_body(data: bytes) -> tuple[list[int], float | None, str | None] | None:
    """(help, announced ttl, assign) of a heartbeat body, or None when it is not one."""
    try:
        body = json.loads(data)
        if not isinstance(body, dict):
            return None
        help_wanted = [int(p) for p in body.get("help", [])]
        ttl = float(body["ttl"]) if "ttl" in body else None
    except (ValueError, TypeError):
        return None
    assign = body.get("assign")
    return help_wanted, ttl, assign if isinstance(assign, str) else None


class Membership:
    """Heartbeats of one member of one subscription, and the live member list."""

    def __init__(
        self,
        storage: Storage,
        keys: Keys,
        topic: str,
        consumer: str,
        member: str,
        ttl_s: float,
        *,
        wake_address: str | None = None,
        ping_version: int = 1,
    ) -> None:
        self.storage = storage
        # where producers ping this member (core/pings.py, I14); None: not pingable
        self.wake_address = wake_address
        # the highest ping version it reads, announced with the address (2: rings, the doorbell)
        self.ping_version = ping_version
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
        self._assign_by_member: dict[str, str | None] = {}
        # every live peer announced the balanced assignment (core/membership.balanced_owners)
        self.balanced = True

    def owned(self, partitions: int) -> list[int]:
        """The partitions this member owns in its current view (the scheme the group agrees on)."""
        return owned_partitions(self.member, self.members, partitions, balanced=self.balanced)

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
            "assign": BALANCED,
        }
        if ttl_s is not None:
            fields["ttl"] = ttl_s
        if self.wake_address is not None:
            fields["wake"] = self.wake_address
            if self.ping_version > 1:
                fields["ping"] = self.ping_version
        body = json.dumps(fields).encode()
        await self.storage.overwrite(self.keys.member(self.topic, self.consumer, self.member), body)

    async def refresh(self) -> list[str]:
        """Re-read the live members (heartbeat younger than the TTL) and the partitions they ask help
        for (a body is only fetched when its ETag changed); keeps the old view on store errors.

        An object under the prefix that is not a heartbeat (a foreign name), or whose body cannot
        be read (a killed writer's empty object), is skipped on its own: it never costs the view
        of the other members (before, one such object made every refresh fail)."""
        prefix = self.keys.members_prefix(self.topic, self.consumer)
        now = time.time()
        try:
            listed = [i async for i in self.storage.list(prefix)]
            help_by_member: dict[str, list[int]] = {}
            ttl_by_member: dict[str, float] = {}
            assign_by_member: dict[str, str | None] = {}
            ages: dict[str, float] = {}
            for info in listed:
                member = heartbeat_member(info.key, prefix)
                if member is None:
                    skip_foreign(info.key, f"{self.topic}/{self.consumer}: reading the member list")
                    continue
                age = now - info.last_modified
                # a heartbeat older than MAX_TTL_S is dead whatever it said (its body is not fetched)
                if age > MAX_TTL_S:
                    continue
                if member == self.member:
                    ages[member] = age
                    continue
                if self._etags.get(member) == info.etag:
                    help_by_member[member] = self._help_by_member.get(member, [])
                    ttl_by_member[member] = self._ttl_by_member.get(member, self.ttl_s)
                    assign_by_member[member] = self._assign_by_member.get(member)
                    ages[member] = age
                    continue
                blob = await self.storage.get(info.key)
                if blob is None:  # gone between LIST and GET: counted as not (yet) known to balance
                    assign_by_member[member] = None
                    ages[member] = age
                    continue
                body = _heartbeat_body(blob.data)
                if body is None:
                    skip_foreign(info.key, f"{self.topic}/{self.consumer}: unreadable heartbeat")
                    continue
                help_by_member[member] = body[0]
                ttl_by_member[member] = min(MAX_TTL_S, body[1] if body[1] is not None else self.ttl_s)
                assign_by_member[member] = body[2]
                self._etags[member] = info.etag
                ages[member] = age
        except StorageError:
            return self.members
        # What each heartbeat said is kept for every heartbeat listed, live or not: it is cached by
        # ETag, and a member whose heartbeat aged out for a moment (a pause, an outage) comes back
        # with the same body, so the same ETag. Keeping only the live ones forgot its "assign", and
        # this member then counted it as an older release for good: it fell back to plain
        # rendezvous while the others stayed balanced, and a partition could end up with no owner
        # (found by the simulation: a quiesced group never claimed a partition's last messages).
        self._ttl_by_member = ttl_by_member
        self._assign_by_member = assign_by_member
        self._help_by_member = help_by_member
        live = {m for m, age in ages.items() if age <= max(self.ttl_s, ttl_by_member.get(m, self.ttl_s))}
        peers = live - {self.member}
        self.balanced = all(assign_by_member.get(m) == BALANCED for m in peers)
        self.help_wanted = {p for m in peers for p in help_by_member.get(m, [])}
        self.members = sorted(live | {self.member})
        return self.members

    async def leave(self) -> None:
        try:
            await self.storage.delete([self.keys.member(self.topic, self.consumer, self.member)])
        except StorageError:
            pass
