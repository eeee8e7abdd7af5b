"""Two sidecars of one consumer: shared work without duplicates, and takeover after SIGKILL."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from bucketq.client import DeliveredMessage, message
from bucketq.client.errors import LeaseLost
from bucketq.config import Settings
from tests.sidecar.sidecar_procs import SidecarFactory, SidecarProc, create_topics

pytestmark = [pytest.mark.s3, pytest.mark.e2e]


async def _publish(sc: SidecarProc, topic: str, count: int, start: int = 0) -> set[str]:
    """Keyed messages, so that they spread over all partitions."""
    ids: set[str] = set()
    async with sc.aclient() as client:
        for first in range(start, start + count, 100):
            batch = await client.publish_batch(
                topic, [message({"n": i}, key=f"k{i}") for i in range(first, min(first + 100, start + count))]
            )
            assert batch.failed == 0, batch
            ids |= {r.result.id for r in batch.results if r.result is not None}
    return ids


async def _work(sc: SidecarProc, got: list[str], stop: asyncio.Event, deadline: float) -> None:
    """A worker app: pull, 'process' a little, ack in a batch."""
    async with sc.aclient() as client:
        while not stop.is_set() and time.monotonic() < deadline:
            msgs = await client.pull(max_messages=10, wait=0.5)
            if msgs:
                await asyncio.sleep(0.02)
                result = await client.ack_batch([m.receipt or "" for m in msgs])
                assert result.failed == 0, result
                got.extend(m.id for m in msgs)


@pytest.mark.slow  # 8-14 s: started early, so it never runs alone at the end
async def test_two_sidecars_share_the_work_without_duplicates(
    seaweedfs_settings: Settings, sidecars: SidecarFactory
) -> None:
    # Both members write to the same cursor logs when they steal: a race test, so on SeaweedFS,
    # whose put-if-absent is atomic (moto's is not under concurrency: two racing deltas can both
    # "win" there, which would show as a duplicate that no real S3 produces).
    await create_topics(seaweedfs_settings, "events", partitions=8)
    # a member takes over another's waiting messages after steal_after_s: even if rendezvous hashing
    # gave one member every partition, both get work
    opts = {
        "consumer": "proc",
        "topics": "events",
        "max_in_flight": 20,
        "BUCKETQ_CONSUMER__STEAL_AFTER_S": 0.2,
    }
    a = sidecars(seaweedfs_settings, "a", **opts)
    b = sidecars(seaweedfs_settings, "b", **opts)
    published = await _publish(a, "events", 200) | await _publish(b, "events", 200, start=200)

    got_a: list[str] = []
    got_b: list[str] = []
    stop = asyncio.Event()
    deadline = time.monotonic() + 60
    workers = [
        asyncio.create_task(_work(a, got_a, stop, deadline)),
        asyncio.create_task(_work(b, got_b, stop, deadline)),
    ]
    while len(got_a) + len(got_b) < len(published) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.gather(*workers)

    counts = Counter(got_a + got_b)
    assert set(counts) == published, f"missing {len(published - set(counts))} of {len(published)}"
    assert [i for i, n in counts.items() if n > 1] == [], "some messages were delivered twice"
    assert got_a and got_b, f"the work was not shared: a={len(got_a)}, b={len(got_b)}"


async def test_sigkill_leases_are_redelivered_by_the_other(
    moto_settings: Settings, sidecars: SidecarFactory
) -> None:
    await create_topics(moto_settings, "tasks", partitions=2)
    opts = {"consumer": "crunch", "topics": "tasks", "visibility_timeout_s": 2, "max_in_flight": 10}
    a = sidecars(moto_settings, "a", **opts)  # alone at first: it owns every partition
    published = await _publish(a, "tasks", 40)

    held: dict[str, DeliveredMessage] = {}
    async with a.aclient() as client:
        deadline = time.monotonic() + 20
        while len(held) < 5:
            assert time.monotonic() < deadline, f"sidecar a got {len(held)} messages within 20s"
            held.update({m.id: m for m in await client.pull(max_messages=5, wait=1)})
    b = sidecars(moto_settings, "b", **opts)
    a.process.kill()  # SIGKILL mid-work: its leases are never released
    assert a.wait_exit(10) == -9

    acked: dict[str, DeliveredMessage] = {}
    async with b.aclient() as client:
        deadline = time.monotonic() + 45
        while len(acked) < len(published):
            assert time.monotonic() < deadline, (
                f"b acked {len(acked)} of {len(published)} within 45s; "
                f"missing from a's leases: {len(set(held) - set(acked))}\n{b.log()}"
            )
            msgs = await client.pull(max_messages=10, wait=1)
            for m in msgs:
                try:
                    await client.ack(m.receipt or "")
                except LeaseLost:
                    continue  # a slow machine outran the 2 s lease: it is delivered again, acked then
                acked[m.id] = m
    assert set(acked) == published
    assert all(acked[i].deliveries >= 2 for i in held), {i: acked[i].deliveries for i in held}
