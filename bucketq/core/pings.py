"""Wake pings: a best-effort datagram that tells a topic's idle readers to look at its wake object
now (invariant I14, docs/protocol.md).

An idle member looks at its topic's wake object every ``wake_poll_ms`` (I13). S3 has no long poll,
so a look costs a GET, and a median pickup under a second would need a GET every two seconds,
around the clock. Pings make the first message after a silence fast without that: a member
advertises a datagram address in its heartbeat (``"wake"``), and a producer that touches a
topic's wake object (core/wake.py) after a quiet spell of its own (no append for
``PING_AFTER_QUIET_S``) sends every advertised address of the topic's members a ping. A member
that receives one looks at the wake object out of turn, and finds the touch.

Invariants:

* **Pings decide nothing.** A ping only moves a member's next look at the wake object earlier;
  what the member then does follows from what the look reads, exactly as on a turn of its own.
  A ping lost, delayed, duplicated, forged or sent to a recycled address changes when a member
  looks, never what any member may claim or commit (correctness rests on the segments and the
  cursor logs; pickup without pings rests on the wake poll, I13).
* **A ping costs a receiver at most one GET a second per topic.** Looks caused by pings are at
  least ``PING_LOOK_GAP_S`` apart (a ping inside the gap is answered at its end, not dropped), so
  a flood of forged datagrams costs a member at most 60 GETs a minute per topic.
* **Sending never blocks or fails a publish.** The producer pings in the background after its
  touch landed; the directory of addresses is read with the producer's own store calls, and any
  error leaves the ping unsent (the wake poll covers it).

The network itself is a port (:class:`PingNetwork`): UDP in production (core/udp_pings.py), a
seeded lossy network in the simulation.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import time
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

from bucketq.core.keys import Keys
from bucketq.core.membership import MAX_TTL_S
from bucketq.errors import StorageError
from bucketq.storage import Storage

log = logging.getLogger("bucketq.pings")

# The datagram: this prefix, then the wake object's key (root included, so a ping for a topic of
# another root or bucket that reaches a recycled address matches no subscription)
PING_PREFIX = b"bucketq-wake/1\n"
MAX_PING_BYTES = 1024
# Looks at the wake object caused by pings are at least this far apart (per member and topic)
PING_LOOK_GAP_S = 1.0
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
    """The wake key a datagram pings, or None when it is not a ping of this version."""
    if len(data) > MAX_PING_BYTES or not data.startswith(PING_PREFIX):
        return None
    try:
        return data[len(PING_PREFIX) :].decode()
    except UnicodeDecodeError:
        return None


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


class Pings:
    """One connection's wake pings: its receiving address, the topics its members listen on, and
    the directory of the members' addresses it pings as a producer."""

    def __init__(self, network: PingNetwork | None, storage: Storage, keys: Keys) -> None:
        self.network = network
        self.storage = storage
        self.keys = keys
        self.address: str | None = None
        self._opened = False
        self._listeners: dict[str, set[Callable[[], None]]] = {}  # wake key -> callbacks
        # heartbeat key -> its advertised address ("" when none): a member's address is fixed
        # for its life (its id is new on every start), so each heartbeat's body is read once
        self._address_of: dict[str, str] = {}
        self.received = 0
        self.sent = 0

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

    def _receive(self, data: bytes) -> None:
        key = parse_ping(data)
        if key is None:
            return
        self.received += 1
        for callback in list(self._listeners.get(key, ())):
            callback()

    async def ping(self, topic: str) -> int:
        """Send a ping for ``topic`` to every member of it whose heartbeat advertises an address;
        how many were sent. Addresses known from the last ping go out first; then the members'
        heartbeats are listed (one LIST; a new member's body is read once) and new ones follow."""
        if self.network is None:
            return 0
        await self.open()  # a connection that only produces sends from the same socket
        payload = ping_payload(self.keys.wake(topic))
        prefix = self.keys.members_topic_prefix(topic)
        sent: set[str] = set()
        for key, address in self._address_of.items():
            if key.startswith(prefix) and address:
                self._send(address, payload, sent)
        try:
            addresses = await self._directory(prefix)
        except (StorageError, ValueError) as exc:
            log.debug("members of %s not listed for pings: %s", topic, exc)
            return len(sent)
        for address in addresses:
            self._send(address, payload, sent)
        return len(sent)

    def _send(self, address: str, payload: bytes, sent: set[str]) -> None:
        if address in sent or self.network is None:
            return
        sent.add(address)
        self.sent += 1
        self.network.send(address, payload)

    async def _directory(self, prefix: str) -> list[str]:
        """The addresses the live-looking heartbeats under ``prefix`` advertise (LIST times:
        anything younger than MAX_TTL_S, so a quiet member's rare heartbeats count; a dead
        member's address costs one lost datagram until its heartbeat ages out)."""
        now = time.time()
        found: dict[str, str] = {}
        async for info in self.storage.list(prefix):
            if now - info.last_modified > MAX_TTL_S:
                continue
            address = self._address_of.get(info.key)
            if address is None:
                address = await self._advertised(info.key)
            found[info.key] = address
        for key in [k for k in self._address_of if k.startswith(prefix) and k not in found]:
            del self._address_of[key]
        self._address_of.update(found)
        return [a for a in found.values() if a]

    async def _advertised(self, key: str) -> str:
        blob = await self.storage.get(key)
        if blob is None:
            return ""
        try:
            body = json.loads(blob.data)
        except ValueError:
            return ""
        return (valid_address(body.get("wake")) if isinstance(body, dict) else None) or ""

    def close(self) -> None:
        if self.network is not None:
            self.network.close()
        self._listeners.clear()
