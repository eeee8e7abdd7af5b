"""The doorbell, producer side (core/pings.py, invariant I14): every append rings the member of
each group that owns the appended partition, naming topic, partition and sequence.

The addresses come from the members' heartbeats, listed once and then at most every
DIRECTORY_REFRESH_S, sooner when the producer's touch of the wake object finds that someone else
touched it (a join or a leave): never a LIST per append. These run on the virtual clock with a
recording network (the ping port); real UDP is the adapter's, tested in test_wake_pings.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from bucketq import Bucketq, Settings
from bucketq.bench.metered import MeteredStore
from bucketq.core.membership import balanced_owners, rendezvous_owner
from bucketq.core.pings import (
    DIRECTORY_REFRESH_S,
    MAX_PING_BYTES,
    MIN_LIST_GAP_S,
    PING_PREFIX,
    RING_PREFIX,
    Ring,
    parse_ping,
    parse_ring,
    ping_payload,
    ring_payload,
)
from bucketq.core.producer import partition_for_key
from bucketq.core.wake import touch_wake
from bucketq.errors import StorageError
from bucketq.storage.memory import MemoryStore
from tests.support.virtual import run_virtual

PARTITIONS = 4


class Recorder:
    """The ping port: records every datagram sent, in order; receives nothing."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def open(self, receive: Callable[[bytes], None]) -> str | None:
        return "udp://10.9.9.9:9"

    def send(self, address: str, payload: bytes) -> None:
        self.sent.append((address, payload))

    def close(self) -> None:
        return None

    def rings(self) -> list[tuple[str, Ring]]:
        return [(a, r) for a, p in self.sent if (r := parse_ring(p)) is not None]

    def pings(self) -> list[str]:
        return [a for a, p in self.sent if parse_ping(p) is not None]


def _address(name: str) -> str:
    return f"udp://10.0.0.{sum(name.encode()) % 250 + 1}:{7000 + len(name)}"


def heartbeat(
    member: str, *, ping: Any = 2, assign: str | None = "balanced", ttl: float = 60.0
) -> dict[str, Any]:
    body: dict[str, Any] = {"member": member, "wake": _address(member), "ttl": ttl}
    if ping is not None:
        body["ping"] = ping
    if assign is not None:
        body["assign"] = assign
    return body


def key_for(partition: int) -> str:
    """A message key that lands in ``partition``."""
    return next(f"k{i}" for i in range(10_000) if partition_for_key(f"k{i}", PARTITIONS) == partition)


@dataclass
class Bell:
    store: MeteredStore
    network: Recorder
    bq: Bucketq
    producer: Any
    members: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    async def join(self, group: str, member: str, **body: Any) -> None:
        await self.store.put(
            self.bq.keys.member("t", group, member), json.dumps(heartbeat(member, **body)).encode()
        )

    async def publish(self, partition: int, n: int = 1) -> list[int]:
        seqs = [(await self.producer.publish("t", i, key=key_for(partition))).seq for i in range(n)]
        await asyncio.sleep(0.05)  # the background listing, if one was due
        return seqs

    def lists(self) -> int:
        return sum(v for k, v in self.store.calls.items() if k.startswith("LIST member"))


async def bell(store: MeteredStore | None = None) -> Bell:
    store = store or MeteredStore(MemoryStore())
    network = Recorder()
    settings = Settings.from_dict({"backend": "memory", "strategy": "conditional_write"})
    bq = Bucketq(settings, store=store, ping_network=network)
    await bq.open()
    await bq.create_topic("t", partitions=PARTITIONS)
    return Bell(store, network, bq, await bq.register_producer("p"))


def owner(members: list[str], partition: int) -> str:
    return balanced_owners(tuple(sorted(members)), PARTITIONS)[partition]


# -- the datagram ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "partition", "seq"), [("t/.wake", 0, 0), ("root/a.b/.wake", 3, 12_345_678)])
def test_a_ring_names_topic_partition_and_sequence(key: str, partition: int, seq: int) -> None:
    data = ring_payload(key, partition, seq)
    assert parse_ring(data) == Ring(key, partition, seq)
    assert parse_ping(data) is None, "a release that reads only version 1 ignores a ring"
    assert parse_ring(ping_payload(key)) is None


@pytest.mark.parametrize(
    "data",
    [
        b"",
        RING_PREFIX,
        RING_PREFIX + b"t/.wake",
        RING_PREFIX + b"t/.wake\n1",
        RING_PREFIX + b"t/.wake\n1 x",
        RING_PREFIX + b"t/.wake\n-1 5",
        RING_PREFIX + b"t/.wake\n1 -5",
        RING_PREFIX + b"\n1 5",
        RING_PREFIX + b"t/.wake\n1 2 3",
        RING_PREFIX + b"\xff\xfe\n1 2",
        ring_payload("t/.wake", 1, 2) + b"0" * MAX_PING_BYTES,
        PING_PREFIX + b"t/.wake\n1 2",
        b"bucketq-wake/3\nt/.wake\n1 2",
    ],
)
def test_anything_but_a_well_formed_ring_is_dropped(data: bytes) -> None:
    assert parse_ring(data) is None


# -- who is rung -----------------------------------------------------------------------------------


def test_an_append_rings_the_owner_of_its_partition_in_each_group() -> None:
    async def main() -> tuple[Bell, dict[int, list[int]]]:
        b = await bell()
        await b.join("a", "m1")
        await b.join("a", "m2")
        await b.join("b", "n1")
        await b.join("old", "o1", ping=None)  # an older release: version-1 pings only
        seqs = {p: await b.publish(p, 2) for p in range(PARTITIONS)}
        await b.bq.close()
        return b, seqs

    b, seqs = run_virtual(main)
    rings = b.network.rings()
    for p, landed in seqs.items():
        for seq in landed:
            to = sorted(a for a, r in rings if (r.partition, r.seq) == (p, seq))
            assert r_keys(rings) == {b.bq.keys.wake("t")}
            assert to == sorted([_address(owner(["m1", "m2"], p)), _address("n1")]), (p, seq, to)
    assert len(rings) == 2 * 2 * PARTITIONS  # two groups read rings, eight appends
    # the member of the older release got its version-1 ping (after the quiet spell), no ring
    assert _address("o1") in b.network.pings()
    assert all(a != _address("o1") for a, _ in rings)
    # after the quiet spell every member also got a version-1 ping (the owner in the producer's
    # view may be stale: each member looks at the wake object)
    assert {_address(m) for m in ("m1", "m2", "n1", "o1")} <= set(b.network.pings())


def r_keys(rings: list[tuple[str, Ring]]) -> set[str]:
    return {r.wake_key for _, r in rings}


def test_a_group_that_does_not_balance_rings_the_rendezvous_owner() -> None:
    async def main() -> tuple[Bell, list[int]]:
        b = await bell()
        await b.join("a", "m1")
        await b.join("a", "m2", assign=None)  # an older member: the group uses plain rendezvous
        await b.join("a", "m3")
        seqs = [s for p in range(PARTITIONS) for s in await b.publish(p)]
        await b.bq.close()
        return b, seqs

    b, _ = run_virtual(main)
    for address, r in b.network.rings():
        assert address == _address(rendezvous_owner(r.partition, ["m1", "m2", "m3"]) or "")


@pytest.mark.parametrize("version", [1, "2", True, None, 1.5])
def test_a_member_that_does_not_announce_rings_is_not_rung(version: Any) -> None:
    async def main() -> Bell:
        b = await bell()
        await b.join("a", "m1", ping=version)
        await b.publish(0, 3)
        await b.bq.close()
        return b

    assert run_virtual(main).network.rings() == []


def test_a_member_whose_heartbeat_aged_out_is_not_rung() -> None:
    async def main() -> tuple[list[tuple[str, Ring]], list[tuple[str, Ring]]]:
        b = await bell()
        await b.join("a", "old", ttl=20)
        await b.publish(0)
        first = b.network.rings()
        await asyncio.sleep(DIRECTORY_REFRESH_S + 1)  # its heartbeat is 31 s old, it said 20
        await b.join("a", "new", ttl=20)
        await b.publish(0)  # due: re-listed in the background, rung from the next append on
        b.network.sent.clear()
        await b.publish(0, 2)
        await b.bq.close()
        return first, b.network.rings()

    first, later = run_virtual(main)
    assert [a for a, _ in first] == [_address("old")]
    assert [a for a, _ in later] == [_address("new")] * 2


# -- what it costs ---------------------------------------------------------------------------------


def test_rings_cost_one_listing_not_one_per_append() -> None:
    async def main() -> tuple[Bell, int, int]:
        b = await bell()
        for m in ("m1", "m2", "m3"):
            await b.join("a", m)
        before_gets = sum(v for k, v in b.store.calls.items() if k.startswith("GET member"))
        await b.publish(1, 40)
        gets = sum(v for k, v in b.store.calls.items() if k.startswith("GET member")) - before_gets
        lists = b.lists()
        await b.bq.close()
        return b, lists, gets

    b, lists, gets = run_virtual(main)
    assert len(b.network.rings()) == 40
    # the ring's listing and the quiet spell's version-1 ping share one LIST; each body read once
    assert (lists, gets) == (1, 3)


def test_a_join_is_rung_once_the_producer_sees_the_wake_object_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    """A joining member touches the wake object ("members"); the producer's next touch is
    conditional on its own last one, fails, and the next append lists the members again."""
    monkeypatch.setattr("bucketq.core.producer.WAKE_REFRESH_S", 2.0)

    async def main() -> tuple[int, list[str]]:
        b = await bell()
        await b.join("a", "m1")
        p = next(p for p in range(PARTITIONS) if owner(["m1", "m2"], p) == "m2")
        await b.publish(p)
        assert b.lists() == 1
        await b.join("a", "m2")
        await touch_wake(b.bq._storage, b.bq.keys, "t", "m2", "members")  # type: ignore[arg-type]
        await asyncio.sleep(2.5)  # the producer's next touch is due
        await b.publish(p)  # touches (conditionally: 412, someone else touched), marks stale
        await b.publish(p)  # lists again
        b.network.sent.clear()
        await b.publish(p, 3)
        lists = b.lists()
        await b.bq.close()
        return lists, [a for a, _ in b.network.rings()]

    lists, rung = run_virtual(main)
    assert lists == 2
    assert rung == [_address("m2")] * 3


def test_without_a_join_the_touches_do_not_list_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bucketq.core.producer.WAKE_REFRESH_S", 2.0)

    async def main() -> int:
        b = await bell()
        await b.join("a", "m1")
        for _ in range(10):  # ten touches over 25 s, each conditional on the last: all land
            await b.publish(0)
            await asyncio.sleep(2.5)
        lists = b.lists()
        await b.bq.close()
        return lists

    assert run_virtual(main) == 1


class RefusingMemberLists(MeteredStore):
    def list(self, prefix: str, *, start_after: str | None = None):  # type: ignore[no-untyped-def]
        if "/_registry/members/" in f"/{prefix}":
            self.calls["LIST member refused"] += 1
            raise StorageError("LIST refused")
        return super().list(prefix, start_after=start_after)


def test_a_refused_listing_rings_nobody_fails_no_publish_and_is_not_retried_per_append() -> None:
    async def main() -> tuple[Bell, int, float]:
        b = await bell(RefusingMemberLists(MemoryStore()))
        await b.join("a", "m1")
        started = asyncio.get_running_loop().time()
        for _ in range(50):  # 50 appends over 5 s
            await b.publish(0)
            await asyncio.sleep(0.1)
        took = asyncio.get_running_loop().time() - started
        refused = b.store.calls["LIST member refused"]
        await b.bq.close()
        return b, refused, took

    b, refused, took = run_virtual(main)
    assert b.network.rings() == []
    assert 1 <= refused <= took / MIN_LIST_GAP_S + 2, refused  # +1: the quiet spell's ping
