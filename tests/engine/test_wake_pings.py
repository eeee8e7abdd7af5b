"""Wake pings (invariant I14, core/pings.py): a producer that starts publishing pings the idle
members of the topic over UDP, and they look at the wake object at once instead of on their next
wake poll. Pings decide nothing: lost, forged or garbage datagrams change only when a member
looks, and a flood of them costs a member at most one look a second.

These run over real UDP sockets on 127.0.0.1; those on the in-memory store wait on the virtual clock
(``@on_virtual_clock_over_loopback``: the datagrams are real, the seconds between them are not).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from bucketq import Bucketq, Settings
from bucketq.bench.metered import MeteredStore
from bucketq.core.cadence import PING_LOOK_GAP_S
from bucketq.core.pings import ping_payload, valid_address
from bucketq.core.udp_pings import UdpPings, advertised_host, udp_pings
from bucketq.errors import StorageError
from bucketq.storage import Storage
from bucketq.storage.memory import MemoryStore
from tests.support.engine_helpers import Backend
from tests.support.virtual_tests import on_virtual_clock, on_virtual_clock_over_loopback

# an idle member whose own looks are far apart: only a ping brings a message within seconds
SLOW_LOOKS = {
    "idle_after_s": 0.3,
    "poll_max_ms": 20,
    "poll_idle_ms": 60_000,
    "wake_poll_ms": 60_000,
    "heartbeat_interval_s": 0.5,
    "heartbeat_idle_s": 30,
    "member_ttl_s": 3,
}
MEMORY = {"backend": "memory", "strategy": "conditional_write"}


def _wake_gets(store: MeteredStore) -> int:
    return sum(n for call, n in store.calls.items() if call.startswith("GET wake"))


def _calls(store: MeteredStore, prefix: str) -> int:
    return sum(n for call, n in store.calls.items() if call.startswith(prefix))


async def _idle_member(b: Backend, **consumer: Any) -> tuple[Bucketq, Any]:
    bq = await b.connect(consumer={**SLOW_LOOKS, **consumer})
    await bq.create_topic("t", partitions=4)
    member = await bq.register_consumer("c", "t")
    assert await member.poll(1, 1.0) == []
    await asyncio.sleep(1.0)  # idle now: its next own look is a minute away
    return bq, member


@dataclass
class Idle:
    """An idle member (its own looks a minute apart) on a metered in-memory bucket."""

    store: MeteredStore
    backend: Backend
    bq: Bucketq
    member: Any

    @property
    def port(self) -> int:
        return _member_port(self.member)


@asynccontextmanager
async def idle_member() -> AsyncIterator[Idle]:
    store = MeteredStore(MemoryStore())
    b = Backend("memory", MEMORY, store)
    bq, member = await _idle_member(b)
    try:
        yield Idle(store, b, bq, member)
    finally:
        await b.close_all()


async def _delivered(producer: Any, member: Any, payload: str) -> None:
    """Publish ``payload`` and see ``member`` receive it within 5 s (its wake poll's reach)."""
    await producer.publish("t", payload)
    got = await member.poll(1, 5.0)
    assert [m.payload for m in got] == [payload]


def _member_port(member: Any) -> int:
    """The UDP port the member's heartbeat advertises (on 127.0.0.1)."""
    address = member._subs["t"].membership.wake_address
    assert address is not None and address.startswith("udp://127.0.0.1:"), address
    return int(address.rsplit(":", 1)[1])


async def _pickup_s(b: Backend, member: Any, payload: str, within: float) -> float | None:
    """Seconds from a publish (by a connection of its own) to its delivery; None if not within."""
    producer_bq = await b.connect()
    producer = await producer_bq.register_producer("p")
    started = time.monotonic()
    await producer.publish("t", payload)
    got = await member.poll(1, within)
    if not got:
        return None
    assert [m.payload for m in got] == [payload]
    await got[0].ack()
    return time.monotonic() - started


async def _a_pinged_member_picks_up(b: Backend) -> None:
    _, member = await _idle_member(b)
    took = await _pickup_s(b, member, "pinged", within=5.0)
    assert took is not None, "a pinged member did not pick the message up within 5 s"
    assert took < 3.0, took


@pytest.mark.parametrize(
    "backend",
    ["file", pytest.param("moto", marks=pytest.mark.s3), pytest.param("seaweedfs", marks=pytest.mark.s3)],
    indirect=True,
)
async def test_a_pinged_member_picks_up_long_before_its_wake_poll(backend: Backend) -> None:
    """On every backend: the member's own next look is a minute away, the ping brings it now.
    (The in-memory store's case is the next test, on the virtual clock.)"""
    await _a_pinged_member_picks_up(backend)


@on_virtual_clock_over_loopback
async def test_a_pinged_member_on_the_in_memory_store_picks_up_long_before_its_wake_poll() -> None:
    """The same on the in-memory store: the ping is a real datagram, the idle second before it and
    the bound on the pickup are on the virtual clock (exact, whatever the machine's load)."""
    b = Backend("memory", MEMORY, MemoryStore())
    try:
        await _a_pinged_member_picks_up(b)
    finally:
        await b.close_all()


@on_virtual_clock
async def test_without_pings_the_same_member_waits_for_its_wake_poll() -> None:
    """The control of the test above: the same member with pings off misses the message for
    seconds, so the fast pickup there was the ping's doing. On the virtual clock (no sockets are
    needed with pings off): under load, real time let a member not yet idle pick it up at once."""
    b = Backend("memory", {**MEMORY, "ping": {"enabled": False}}, MemoryStore())
    try:
        _, member = await _idle_member(b)
        assert await _pickup_s(b, member, "unpinged", within=3.0) is None
    finally:
        await b.close_all()


class _DroppingUdp(UdpPings):
    """Real UDP, but every datagram sent is lost."""

    def send(self, address: str, payload: bytes) -> None:
        return None


@on_virtual_clock_over_loopback
async def test_lost_pings_only_delay_pickup_to_the_wake_poll() -> None:
    store = MemoryStore()
    b = Backend("memory", MEMORY, store)
    try:
        bq = await b.connect(consumer={**SLOW_LOOKS, "wake_poll_ms": 1500})
        await bq.create_topic("t", partitions=4)
        member = await bq.register_consumer("c", "t")
        assert await member.poll(1, 1.0) == []
        await asyncio.sleep(1.0)
        producer_bq = Bucketq(b.settings(), store=store, ping_network=_DroppingUdp("127.0.0.1"))
        await producer_bq.open()
        b.opened.append(producer_bq)
        await _delivered(await producer_bq.register_producer("p"), member, "after a lost ping")
    finally:
        await b.close_all()


@on_virtual_clock_over_loopback
async def test_a_flood_of_forged_pings_costs_at_most_one_look_a_second() -> None:
    async with idle_member() as idle:
        store, bq, port = idle.store, idle.bq, idle.port
        forged = ping_payload(bq.keys.wake("t"))
        before, claims_before = _wake_gets(store), _calls(store, "PUT delta")
        seconds = 3.0
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                for _ in range(50):
                    sock.sendto(forged, ("127.0.0.1", port))
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        looks = _wake_gets(store) - before
        assert bq._pings is not None and bq._pings.received > 1000  # the flood arrived
        # one look at once, then one per gap; nothing else was due (the wake poll is a minute)
        assert PING_LOOK_GAP_S == 1.0
        assert 1 <= looks <= 5, looks  # 1 + 3 s / 1 s, and one the wait above may have let in
        # and nothing was claimed: the looks found the wake object unchanged
        assert _calls(store, "PUT delta") == claims_before


@on_virtual_clock_over_loopback
async def test_garbage_and_foreign_datagrams_are_ignored_and_a_real_ping_still_works() -> None:
    async with idle_member() as idle:
        store, bq, port = idle.store, idle.bq, idle.port
        before = _wake_gets(store)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for junk in (
                b"",
                b"\xff" * 64,
                b"bucketq-wake/1\n\xff\xfe",  # not UTF-8
                ping_payload("other-root/t/.wake"),  # another root's topic
                ping_payload(bq.keys.wake("t")) + b"x" * 2000,  # oversized
                b"bucketq-wake/9\n" + bq.keys.wake("t").encode(),  # a later version
            ):
                sock.sendto(junk, ("127.0.0.1", port))
        await asyncio.sleep(0.5)
        assert _wake_gets(store) == before, "a datagram that is not this topic's ping caused a look"
        took = await _pickup_s(idle.backend, idle.member, "still pinged", within=5.0)
        assert took is not None and took < 3.0, took


@on_virtual_clock_over_loopback
async def test_a_heartbeat_advertises_the_address_and_each_body_is_read_once() -> None:
    async with idle_member() as idle:
        store, b, bq, member = idle.store, idle.backend, idle.bq, idle.member
        blob = await store.get(bq.keys.member("t", "c", member.member))
        assert blob is not None
        address = json.loads(blob.data)["wake"]
        assert address == member._subs["t"].membership.wake_address
        assert valid_address(address) == address
        producer_bq = await b.connect()
        pings = producer_bq._pings
        assert pings is not None
        calls = Counter(store.calls)
        assert await pings.ping("t") == 1
        first = Counter(store.calls) - calls
        assert _calls_in(first, "LIST") == 1 and _calls_in(first, "GET member") == 1, first
        calls = Counter(store.calls)
        assert await pings.ping("t") == 1
        second = Counter(store.calls) - calls
        # the member's heartbeat body is not read again: its address is fixed for its life
        assert _calls_in(second, "LIST") == 1 and _calls_in(second, "GET") == 0, second


def _calls_in(calls: Counter[str], prefix: str) -> int:
    return sum(n for call, n in calls.items() if call.startswith(prefix))


@on_virtual_clock_over_loopback
async def test_a_producer_whose_touch_failed_sends_no_ping() -> None:
    class RefusingWakes(MeteredStore):
        async def put(self, key: str, data: bytes, **kw):  # type: ignore[no-untyped-def]
            if key.endswith("/.wake"):
                raise StorageError("wake writes refused")
            return await super().put(key, data, **kw)

    store = RefusingWakes(MemoryStore())
    b = Backend("memory", MEMORY, store)
    try:
        await _idle_member(b)
        producer_bq = await b.connect()
        producer = await producer_bq.register_producer("p")
        await producer.publish("t", "unannounced")
        await producer.close()
        assert producer_bq._pings is not None and producer_bq._pings.sent == 0
    finally:
        await b.close_all()


@pytest.mark.parametrize(
    "address",
    [
        "udp://example.com:7470",  # a name: producers never resolve what a heartbeat says
        "http://10.0.0.1:7470",
        "udp://10.0.0.1",
        "udp://10.0.0.1:0",
        "udp://10.0.0.1:70000",
        "udp://[::1:7470",
        7470,
        None,
        "udp://" + "1" * 200,
    ],
)
def test_only_udp_ip_literal_addresses_are_pinged(address: object) -> None:
    assert valid_address(address) is None


@pytest.mark.parametrize("address", ["udp://10.0.0.1:7470", "udp://[fd00::1]:7470", "udp://127.0.0.1:1"])
def test_udp_ip_literal_addresses_are_valid(address: str) -> None:
    assert valid_address(address) == address


async def test_heartbeats_announcing_bad_addresses_are_skipped() -> None:
    store = MemoryStore()
    b = Backend("memory", MEMORY, store)
    try:
        bq = await b.connect()
        await bq.create_topic("t", partitions=1)
        for i, wake in enumerate(["udp://example.com:1", "tcp://10.0.0.1:1", 12, None]):
            body = {"member": f"m{i}", "wake": wake}
            await store.put(bq.keys.member("t", "c", f"m{i}"), json.dumps(body).encode())
        await store.put(bq.keys.member("t", "c", "broken"), b"{not json")
        assert bq._pings is not None
        assert await bq._pings.ping("t") == 0
    finally:
        await b.close_all()


async def test_an_address_that_cannot_be_bound_leaves_pings_off_and_the_queue_working(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 192.0.2.1 (TEST-NET-1) is assigned to no interface here: binding it fails
    b = Backend("memory", {**MEMORY, "ping": {"advertise_host": "192.0.2.1"}}, MemoryStore())
    try:
        with caplog.at_level(logging.WARNING, "bucketq.pings"):
            bq = await b.connect(consumer={**SLOW_LOOKS, "wake_poll_ms": 500})
            await bq.create_topic("t", partitions=1)
            member = await bq.register_consumer("c", "t")
        assert "wake pings cannot be received" in caplog.text
        assert member._subs["t"].membership.wake_address is None
        await _delivered(await bq.register_producer("p"), member, "still delivered")
    finally:
        await b.close_all()


async def test_the_advertised_host_is_the_route_to_the_bucket() -> None:
    base: dict[str, Any] = {"backend": "s3", "s3_bucket": "b"}
    local = Settings.from_dict({**base, "s3_endpoint_url": "http://127.0.0.1:9"})
    assert await advertised_host(local) == "127.0.0.1"
    given = Settings.from_dict({**base, "ping": {"advertise_host": "10.1.2.3"}})
    assert await advertised_host(given) == "10.1.2.3"
    assert await advertised_host(Settings.from_dict(MEMORY)) == "127.0.0.1"


async def test_no_route_to_the_bucket_turns_pings_off_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    unresolvable = Settings.from_dict(
        {"backend": "s3", "s3_bucket": "b", "s3_endpoint_url": "http://no-such-host.invalid:9000"}
    )
    with caplog.at_level(logging.WARNING, "bucketq.pings"):
        assert await udp_pings(unresolvable) is None
    assert "BUCKETQ_PING__ADVERTISE_HOST" in caplog.text
    assert await udp_pings(Settings.from_dict({**MEMORY, "ping": {"enabled": False}})) is None


class _FailingMemberLists(MeteredStore):
    """A store whose LISTs of the member registry fail (the producer's directory read)."""

    def list(self, prefix: str, *, start_after: str | None = None):  # type: ignore[no-untyped-def]
        if "/_registry/members/" in f"/{prefix}":
            raise StorageError("LIST refused")
        return super().list(prefix, start_after=start_after)


@on_virtual_clock_over_loopback
async def test_a_directory_that_cannot_be_listed_sends_the_known_addresses_and_fails_nothing() -> None:
    async with idle_member() as idle:
        store, b, member = idle.store, idle.backend, idle.member
        producer_bq = await b.connect()
        pings = producer_bq._pings
        assert pings is not None
        assert await pings.ping("t") == 1  # learns the member's address
        failing = _FailingMemberLists(store.inner)
        pings.storage = Storage(failing)
        assert await pings.ping("t") == 1  # the LIST failed: the address it knew still gets its ping
        got = await member.poll(1, 0.5)
        assert got == []  # nothing was published: the ping's look found no change


async def test_a_ping_to_a_gone_member_is_dropped_and_the_socket_keeps_working() -> None:
    network = UdpPings("127.0.0.1")
    received: list[bytes] = []
    address = await network.open(received.append)
    assert address is not None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as gone:
        gone.bind(("127.0.0.1", 0))
        dead = f"udp://127.0.0.1:{gone.getsockname()[1]}"
    try:
        for _ in range(3):
            network.send(dead, b"x")  # ICMP port unreachable comes back: logged, not raised
            network.send("udp://[::1]:9", b"x")  # another address family: dropped
            await asyncio.sleep(0.05)
        network.send(address, ping_payload("t/.wake"))
        for _ in range(100):
            if received:
                break
            await asyncio.sleep(0.01)
        assert received == [ping_payload("t/.wake")]
    finally:
        network.close()
        network.close()  # twice is fine
    network.send(address, b"after close")  # dropped, no error


@on_virtual_clock_over_loopback
async def test_a_producer_pings_after_a_quiet_spell_not_on_every_touch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a producer keeps appending, its refresh touches go without pings (the readers of its
    partitions are finding messages); after a quiet spell, the next touch pings again."""
    async with idle_member() as idle:
        monkeypatch.setattr("bucketq.core.producer.WAKE_REFRESH_S", 0.5)
        monkeypatch.setattr("bucketq.core.producer.PING_AFTER_QUIET_S", 0.4)
        store = idle.store
        producer_bq = await idle.backend.connect()
        producer = await producer_bq.register_producer("p")
        pings = producer_bq._pings
        assert pings is not None
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # an append every 0.1 s: touches every 0.5 s
            await producer.publish("t", "stream")
            await asyncio.sleep(0.1)
        await producer.flush()
        await asyncio.sleep(0.1)
        touches = sum(n for call, n in store.calls.items() if call.startswith("PUT wake"))
        assert touches >= 3, store.calls
        assert pings.sent == 1  # the stream's first touch only
        await asyncio.sleep(0.6)  # quiet
        await producer.publish("t", "after a quiet spell")
        await producer.flush()
        for _ in range(100):
            if pings.sent == 2:
                break
            await asyncio.sleep(0.01)
        assert pings.sent == 2
