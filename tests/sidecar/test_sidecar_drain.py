"""SIGTERM drain: refuse new work, finish what is in flight, release prefetched messages, exit 0."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from bucketq import Bucketq
from bucketq.client import DeliveredMessage, Unavailable, message
from bucketq.config import Settings
from tests.sidecar.sidecar_procs import SidecarFactory, aeventually, create_topics
from tests.support.servers import S3Server

pytestmark = [pytest.mark.s3, pytest.mark.e2e]


async def test_sigterm_drain_loses_nothing(
    moto_server: S3Server, moto_settings: Settings, sidecars: SidecarFactory
) -> None:
    await create_topics(moto_settings, "drain")
    a = sidecars(
        moto_settings,
        "a",
        consumer="d",
        topics="drain",
        max_in_flight=50,
        drain_grace_s=20,
        visibility_timeout_s=4,  # bounds the wait if prefetched leases were not released
    )
    async with a.aclient() as client:
        first = await client.publish_batch("drain", [message({"n": i}) for i in range(60)])
        published = {r.result.id for r in first.results if r.result is not None}
        assert len(published) == 60

        held: list[DeliveredMessage] = []
        deadline = time.monotonic() + 20
        while len(held) < 5:
            assert time.monotonic() < deadline, f"pulled {len(held)} of 5 within 20s"
            held += await client.pull(max_messages=5 - len(held), wait=1)
        await aeventually(
            lambda: a.status()["leases_held"] >= 50, 20, "sidecar a to prefetch up to max_in_flight"
        )

        # S3 stalls (the server is frozen, requests wait for it): the late batch is accepted and
        # still pending when SIGTERM arrives; it must be made durable during the drain
        moto_server.process.send_signal(signal.SIGSTOP)
        try:
            in_flight = asyncio.create_task(
                client.publish_batch("drain", [message({"late": i}) for i in range(10)])
            )
            await aeventually(lambda: a.status()["publish_pending"] == 10, 10, "the late batch to be pending")
            a.signal(signal.SIGTERM)
            await aeventually(lambda: a.status()["state"] == "draining", 10, "sidecar a to start draining")

            with pytest.raises(Unavailable) as refused:
                await client.publish("drain", {"too": "late"})
            assert refused.value.code == "draining"
            with pytest.raises(Unavailable):
                await client.pull(max_messages=1)
        finally:
            moto_server.process.send_signal(signal.SIGCONT)

        late = await in_flight  # accepted before SIGTERM: made durable, not dropped
        assert late.failed == 0, late
        published |= {r.result.id for r in late.results if r.result is not None}
        acked = await client.ack_batch([m.receipt or "" for m in held])  # the app finishes its work
        assert acked.failed == 0, acked
    assert a.wait_exit(30) == 0, a.log()

    b = sidecars(moto_settings, "b", consumer="d", topics="drain")
    rest: dict[str, DeliveredMessage] = {}
    async with b.aclient() as client:
        deadline = time.monotonic() + 30
        while len(rest) < len(published) - len(held):
            assert time.monotonic() < deadline, (
                f"b got {len(rest)} of {len(published) - len(held)} within 30s"
            )
            msgs = await client.pull(max_messages=100, wait=1)
            rest.update({m.id: m for m in msgs})
            if msgs:
                await client.ack_batch([m.receipt or "" for m in msgs])
    assert set(rest) | {m.id for m in held} == published
    assert not set(rest) & {m.id for m in held}, "acked messages came back"


async def test_sigterm_releases_prefetched_messages_uncounted(
    moto_settings: Settings, sidecars: SidecarFactory
) -> None:
    await create_topics(moto_settings, "prefetch")
    a = sidecars(moto_settings, "a", consumer="p", topics="prefetch", max_in_flight=20)
    async with a.aclient() as client:
        await client.publish_batch("prefetch", [message({"n": i}) for i in range(20)])
    await aeventually(lambda: a.status()["leases_held"] == 20, 20, "sidecar a to prefetch 20 messages")
    a.signal(signal.SIGTERM)
    assert a.wait_exit(30) == 0, a.log()
    async with Bucketq(moto_settings) as bq:
        (stats,) = await bq.stats("prefetch", "p")
    assert (stats.in_flight, stats.redelivered, stats.backlog) == (0, 0, 20)
