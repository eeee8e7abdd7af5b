"""Wake pings: a best-effort datagram that tells a topic's idle readers to look at its wake object
now (invariant I14, docs/protocol.md).

An idle member looks at its topic's wake object every ``wake_poll_ms`` (I13). S3 has no long poll,
so a look costs a GET, and a median pickup under a second would need a GET every two seconds,
around the clock. Pings make the first message after a silence fast without that: a member
advertises a datagram address in its heartbeat (``"wake"``), and a producer that touches a
topic's wake object (core/wake.py) after a quiet spell of its own (no append for
``PING_AFTER_QUIET_S``) sends every advertised address of the topic's members a ping. A member
that receives one looks at the wake object out of turn, and finds the touch.

**The doorbell** (rings, version 2): a producer also rings on *every* append, so a message is
seen one round trip after it is durable, not a poll later. The datagram names the topic, the
partition and the sequence number of the segment, and goes to the member of each group that owns
the partition (rendezvous over the live members, as the members assign themselves; a member
announces that it reads rings with ``"ping": 2`` in its heartbeat). The addresses come from the
heartbeats: listed once per topic, again at most every ``DIRECTORY_REFRESH_S``, and sooner when
the producer's touch of the wake object finds that someone else touched it (joins and leaves touch
it), but never more often than ``MIN_LIST_GAP_S``: a LIST is never the price of an append.

Invariants:

* **Pings decide nothing.** A ping only moves a member's next look at the wake object earlier;
  what the member then does follows from what the look reads, exactly as on a turn of its own.
  A ping lost, delayed, duplicated, forged or sent to a recycled address changes when a member
  looks, never what any member may claim or commit (correctness rests on the segments and the
  cursor logs; pickup without pings rests on the wake poll, I13).
* **A ping costs a receiver at most one GET a second per topic.** Looks caused by pings are at
  least ``cadence.PING_LOOK_GAP_S`` apart (a ping inside the gap is answered at its end, not dropped), so
  a flood of forged datagrams costs a member at most 60 GETs a minute per topic.
* **Sending never blocks or fails a publish.** The producer pings in the background after its
  touch landed, and rings from the directory it has (a listing runs in the background); the
  directory is read with the producer's own store calls, and any error leaves the ping or ring
  unsent (the members' polling covers it).
* **A ring decides nothing either.** It names a segment; the member reads that segment, and
  what the store returns decides, exactly as a poll that found it would. A ring for a segment
  that does not exist (forged, or of another incarnation) costs the GET that finds nothing.

The network itself is a port (:class:`PingNetwork`): UDP in production (core/udp_pings.py), a
seeded lossy network in the simulation.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

from bucketq.core.keys import Keys
from bucketq.core.membership import BALANCED, MAX_TTL_S, balanced_owners, rendezvous_owner
from bucketq.errors import StorageError
from bucketq.storage import Storage

log = logging.getLogger("bucketq.pings")

# The datagram: this prefix, then the wake object's key (root included, so a ping for a topic of
# another root or bucket that reaches a recycled address matches no subscription)
PING_PREFIX = b"bucketq-wake/1\n"
MAX_PING_BYTES = 1024
# A ring (version 2): this prefix, the wake object's key, a newline, then the partition and the
# sequence number of the segment just appended ("3 1207"). Sent on every append to the members
# that own the partition and announce (heartbeat ``"ping": 2``) that they read rings; a member of
# an older release announces nothing and is not rung (it would ignore this prefix). Version-1
# pings after a quiet spell still go to every member.
RING_PREFIX = b"bucketq-wake/2\n"
RING_VERSION = 2
# A producer re-reads the member list of a topic it rings at least this often (one LIST of the
# topic's heartbeats; a heartbeat's body only when its ETag changed), and sooner when its touch of
# the wake object finds that someone else touched it (a member joined or left; core/wake.py)
DIRECTORY_REFRESH_S = 30.0
# ... but rings start a listing at most this often per topic (a store refusing LISTs, or members
# churning, costs at most one LIST a second, never one per append)
MIN_LIST_GAP_S = 1.0
# A producer pings with a touch only when its previous append to the topic is this old: readers go
# idle after idle_after_s (10 s) without a find, so while it appends more often than this the
# owners of its partitions are not idle, and each ping would cost a LIST for nothing
PING_AFTER_QUIET_S = 5.0


class PingNetwork(Protocol):
    """Carries small datagrams between processes, best effort.

    ``open`` starts receiving: each datagram that arrives is handed to ``receive`` on the event
    loop; it returns the address peers send to (``"udp://10.0.0.7:7470"``), or None when this
    process cannot receive (pings then only go out). ``send`` never raises and never blocks: a
    datagram it cannot send is dropped. ``close`` stops both; it may be called twice.
    """

    async def open(self, receive: Callable[[bytes], None]) -> str | None: ...

    def send(self, address: str, payload: bytes) -> None: ...

    def close(self) -> None: ...


def ping_payload(wake_key: str) -> bytes:
    return PING_PREFIX + wake_key.encode()


def parse_ping(data: bytes) -> str | None:
    """The wake key a datagram pings, or None when it is not a ping of version 1."""
    if len(data) > MAX_PING_BYTES or not data.startswith(PING_PREFIX):
        return None
    try:
        return data[len(PING_PREFIX) :].decode()
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True)
class Ring:
    """A ring: segment ``seq`` of ``partition`` of the topic whose wake object is ``wake_key`` was
    just appended. A hint: the member reads that segment, and what it reads decides."""

    wake_key: str
    partition: int
    seq: int


def ring_payload(wake_key: str, partition: int, seq: int) -> bytes:
    return RING_PREFIX + f"{wake_key}\n{partition} {seq}".encode()


def parse_ring(data: bytes) -> Ring | None:
    """The ring a datagram carries, or None when it is not a well-formed ring."""
    if len(data) > MAX_PING_BYTES or not data.startswith(RING_PREFIX):
        return None
    try:
        key, _, where = data[len(RING_PREFIX) :].decode().rpartition("\n")
        partition, seq = (int(x) for x in where.split(" "))
    except (UnicodeDecodeError, ValueError):
        return None
    if not key or partition < 0 or seq < 0:
        return None
    return Ring(key, partition, seq)


def valid_address(address: object) -> str | None:
    """``address`` when it is ``udp://<IP literal>:<port>``, else None.

    Only literals: a heartbeat (anyone with write access to the registry) must not make
    producers resolve names.
    """
    if not isinstance(address, str) or len(address) > 100:
        return None
    try:
        parts = urlsplit(address)
        port = parts.port
        ipaddress.ip_address(parts.hostname or "")
    except ValueError:
        return None
    if parts.scheme != "udp" or port is None or not 0 < port < 65536:
        return None
    return address


@dataclass(frozen=True)
class _Heartbeat:
    """What a member's heartbeat says that a producer needs (read once per ETag)."""

    etag: str
    address: str  # "" when it advertises none
    version: int  # the highest ping version it reads (1 when it says nothing)
    ttl: float  # how long it says it stays live without a newer heartbeat (0: nothing said)
    balanced: bool  # it announces the balanced assignment


@dataclass
class _Directory:
    """One topic's members as a producer rings them: per consumer group, the live members (sorted)
    and whether the group uses the balanced assignment; and each member's address."""

    loaded_at: float  # monotonic time the LIST started
    groups: dict[str, tuple[list[str], bool]] = field(default_factory=dict)
    addresses: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)  # (group, member)
    stale: bool = False


class Pings:
    """One connection's wake pings: its receiving address, the topics its members listen on, and
    the directory of the members' addresses it pings and rings as a producer."""

    def __init__(
        self, network: PingNetwork | None, storage: Storage, keys: Keys, *, member_ttl_s: float = 20.0
    ) -> None:
        self.network = network
        self.storage = storage
        self.keys = keys
        # a heartbeat that announces no TTL counts as live this long (the groups' member_ttl_s)
        self.member_ttl_s = member_ttl_s
        self.address: str | None = None
        self._opened = False
        self._listeners: dict[str, set[Callable[[], None]]] = {}  # wake key -> callbacks
        self._ring_listeners: dict[str, set[Callable[[int, int], None]]] = {}  # wake key -> callbacks
        # heartbeat key -> what it says, read once per ETag (a member's address is fixed for its
        # life: its id is new on every start)
        self._heartbeats: dict[str, _Heartbeat] = {}
        self._directories: dict[str, _Directory] = {}  # topic -> its members, as last listed
        self._loading: dict[str, asyncio.Future[_Directory | None]] = {}
        self._listed_at: dict[str, float] = {}  # topic -> when its last listing started (monotonic)
        self._tasks: set[asyncio.Task[None]] = set()
        self.received = 0
        self.sent = 0
        self.rung = 0  # rings sent

    async def open(self) -> str | None:
        """Start receiving (once); this connection's address, None when it cannot receive."""
        if self._opened or self.network is None:
            return self.address
        self._opened = True
        try:
            self.address = await self.network.open(self._receive)
        except OSError as exc:
            log.warning("wake pings cannot be received (%s): idle pickup waits for the wake poll", exc)
            self.address = None
        return self.address

    def listen(self, topic: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` on each ping for ``topic``; returns the call that stops it."""
        key = self.keys.wake(topic)
        self._listeners.setdefault(key, set()).add(callback)
        return lambda: self._listeners.get(key, set()).discard(callback)

    def listen_rings(self, topic: str, callback: Callable[[int, int], None]) -> Callable[[], None]:
        """Call ``callback(partition, seq)`` on each ring for ``topic``; returns the call that stops it."""
        key = self.keys.wake(topic)
        self._ring_listeners.setdefault(key, set()).add(callback)
        return lambda: self._ring_listeners.get(key, set()).discard(callback)

    def _receive(self, data: bytes) -> None:
        ring = parse_ring(data)
        if ring is not None:
            self.received += 1
            for ring_callback in list(self._ring_listeners.get(ring.wake_key, ())):
                ring_callback(ring.partition, ring.seq)
            return
        key = parse_ping(data)
        if key is None:
            return
        self.received += 1
        for callback in list(self._listeners.get(key, ())):
            callback()

    # -- producing: pings after a quiet spell (version 1) ------------------------------------------

    async def ping(self, topic: str, *, listed_since: float | None = None) -> int:
        """Send a version-1 ping for ``topic`` to every member of it whose heartbeat advertises an
        address; how many were sent. Addresses known from the last listing go
        out first; then the members' heartbeats are listed (one LIST; a changed heartbeat's body
        is read) and new ones follow. ``listed_since`` (monotonic): a listing started at or after
        it is recent enough, and is not repeated."""
        if self.network is None:
            return 0
        await self.open()  # a connection that only produces sends from the same socket
        payload = ping_payload(self.keys.wake(topic))
        sent: set[str] = set()
        known = self._directories.get(topic)
        if known is not None:
            self._ping_all(known, payload, sent)
        fresh = known is not None and listed_since is not None and known.loaded_at >= listed_since
        directory = known if fresh else await self._load(topic)
        if directory is not None:
            self._ping_all(directory, payload, sent)
        return len(sent)

    def _ping_all(self, directory: _Directory, payload: bytes, sent: set[str]) -> None:
        # every member, ring readers too: a ring goes to the owner in this producer's view, which
        # may be stale (a join it has not listed yet); the ping makes each look at the wake object
        for address, _ in directory.addresses.values():
            if address:
                self._send(address, payload, sent)

    def _send(self, address: str, payload: bytes, sent: set[str]) -> None:
        if address in sent or self.network is None:
            return
        sent.add(address)
        self.sent += 1
        self.network.send(address, payload)

    # -- producing: a ring on every append (version 2) ---------------------------------------------

    def ring(self, topic: str, partition: int, seq: int, partitions: int) -> None:
        """Segment ``seq`` of ``partition`` was appended: ring the member of each group that owns
        the partition, if it reads rings. Never blocks: the directory is the last listing (read
        in the background when there is none yet, then rung; re-read when older than
        DIRECTORY_REFRESH_S or marked stale)."""
        if self.network is None:
            return
        directory = self._directories.get(topic)
        now = time.monotonic()
        may_list = topic in self._loading or now - self._listed_at.get(topic, float("-inf")) >= MIN_LIST_GAP_S
        if directory is None:
            if may_list:  # rung once the listing (this one, or the one in flight) is in
                self._spawn(self._refresh(topic, (partition, seq, partitions)))
            return
        if may_list and (directory.stale or now - directory.loaded_at >= DIRECTORY_REFRESH_S):
            self._spawn(self._refresh(topic, None))
        self._ring(topic, directory, partition, seq, partitions)

    def stale(self, topic: str) -> None:
        """The topic's members may have changed (a join or leave touched its wake object): the
        next ring re-reads them."""
        directory = self._directories.get(topic)
        if directory is not None:
            directory.stale = True

    def _ring(self, topic: str, directory: _Directory, partition: int, seq: int, partitions: int) -> None:
        if self.network is None or partitions <= 0 or not 0 <= partition < partitions:
            return
        payload = ring_payload(self.keys.wake(topic), partition, seq)
        for group, (members, balanced) in directory.groups.items():
            owner = (
                balanced_owners(tuple(members), partitions)[partition]
                if balanced
                else rendezvous_owner(partition, members)
            )
            address, version = directory.addresses.get((group, owner or ""), ("", 0))
            if address and version >= RING_VERSION:
                self.rung += 1
                self.network.send(address, payload)

    async def _refresh(self, topic: str, then: tuple[int, int, int] | None) -> None:
        await self.open()
        directory = await self._load(topic)
        if directory is not None and then is not None:
            self._ring(topic, directory, *then)

    def _spawn(self, coro: Coroutine[None, None, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the directory -------------------------------------------------------------------------------

    async def _load(self, topic: str) -> _Directory | None:
        """List the topic's members (one listing at a time per topic: a caller joins the one in
        flight); the new directory, or None (logged) when the store refused (the last one stays).
        The first caller lists in its own task (no hop through another)."""
        pending = self._loading.get(topic)
        if pending is not None:
            return await asyncio.shield(pending)
        self._listed_at[topic] = time.monotonic()
        future: asyncio.Future[_Directory | None] = asyncio.get_running_loop().create_future()
        self._loading[topic] = future
        try:
            directory = await self._list(topic)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a joiner, if any, gets it too
            raise
        finally:
            self._loading.pop(topic, None)
        future.set_result(directory)
        return directory

    async def _list(self, topic: str) -> _Directory | None:
        """The members under the topic's registry by their heartbeats: live (by LIST times) while
        younger than the TTL they announced (or ``member_ttl_s``), never beyond MAX_TTL_S; a dead
        member's address costs one lost datagram until its heartbeat ages out."""
        prefix = self.keys.members_topic_prefix(topic)
        started, now = time.monotonic(), time.time()
        directory = _Directory(started)
        seen: set[str] = set()
        groups: dict[str, list[str]] = {}
        balanced: dict[str, bool] = {}
        try:
            async for info in self.storage.list(prefix):
                age = now - info.last_modified
                if age > MAX_TTL_S:
                    continue
                group, _, name = info.key[len(prefix) :].partition("/")
                member = name.removesuffix(".json")
                if not group or not member or "/" in member:
                    continue
                seen.add(info.key)
                beat = self._heartbeats.get(info.key)
                if beat is None or beat.etag != info.etag:
                    beat = await self._read(info.key, info.etag)
                    if beat is None:
                        continue
                    self._heartbeats[info.key] = beat
                if age > max(self.member_ttl_s, beat.ttl):
                    continue
                groups.setdefault(group, []).append(member)
                balanced[group] = balanced.get(group, True) and beat.balanced
                directory.addresses[(group, member)] = (beat.address, beat.version)
        except (StorageError, ValueError) as exc:
            log.debug("members of %s not listed for pings: %s", topic, exc)
            return None
        for key in [k for k in self._heartbeats if k.startswith(prefix) and k not in seen]:
            del self._heartbeats[key]
        directory.groups = {g: (sorted(m), balanced[g]) for g, m in groups.items()}
        self._directories[topic] = directory
        return directory

    async def _read(self, key: str, etag: str) -> _Heartbeat | None:
        blob = await self.storage.get(key)
        if blob is None:
            return None
        try:
            body = json.loads(blob.data)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _Heartbeat(blob.etag or etag, "", 1, 0.0, False)
        version = body.get("ping", 1)
        ttl = body.get("ttl", 0.0)
        return _Heartbeat(
            blob.etag or etag,
            valid_address(body.get("wake")) or "",
            version if isinstance(version, int) and not isinstance(version, bool) else 1,
            min(float(ttl), MAX_TTL_S) if isinstance(ttl, int | float) and not isinstance(ttl, bool) else 0.0,
            body.get("assign") == BALANCED,
        )

    def close(self) -> None:
        if self.network is not None:
            self.network.close()
        self._listeners.clear()
        self._ring_listeners.clear()
        for task in self._tasks:
            task.cancel()
