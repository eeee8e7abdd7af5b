"""The doorbell through a sidecar (docs/protocol.md I14): a real sidecar process whose own polls of
an active topic are a minute apart answers its long-polling app, and pushes to its app, as soon
as the producer's ring arrives, message after message."""

from __future__ import annotations

import asyncio
import time

import pytest

from bucketq import Bucketq
from bucketq.client import DeliveredMessage, PushServer
from bucketq.config import Settings
from tests.sidecar.sidecar_procs import SidecarFactory, create_topics

pytestmark = [pytest.mark.s3, pytest.mark.e2e]

# The topic stays active (no wake object, no version-1 ping: a ping acts only on an idle topic),
# and the sidecar's own looks at the partitions' tails are a minute apart: only a ring brings a
# message in seconds.
SLOW_POLLS = {
    "BUCKETQ_CONSUMER__POLL_MIN_MS": "60000",
    "BUCKETQ_CONSUMER__POLL_MAX_MS": "60000",
    "BUCKETQ_CONSUMER__IDLE_AFTER_S": "3600",
    "BUCKETQ_CONSUMER__COMMIT_LINGER_MS": "0",
}
MESSAGES = 3
PICKUP_S = 5.0  # far below the minute a poll would take, far above a ring and a GET on a busy host


async def test_a_long_polling_app_is_answered_when_the_bell_rings(
    moto_settings: Settings, sidecars: SidecarFactory
) -> None:
    await create_topics(moto_settings, "orders", partitions=2)
    sc = sidecars(moto_settings, "rung", consumer="billing", topics="orders", **SLOW_POLLS)
    async with sc.aclient() as client, Bucketq(moto_settings) as bq:
        assert await client.pull(max_messages=1, wait=2) == []  # its first looks found nothing
        producer = await bq.register_producer("shop")
        for n in range(MESSAGES):
            pull = asyncio.create_task(client.pull(max_messages=1, wait=30))
            await asyncio.sleep(0.5)  # the app is long-polling
            started = time.monotonic()
            await producer.publish("orders", {"order": n})
            msgs = await pull
            took = time.monotonic() - started
            assert [m.payload for m in msgs] == [{"order": n}]
            assert took < PICKUP_S, (
                f"message {n} picked up after {took:.1f} s: the ring did not reach the sidecar"
            )
            assert (await client.ack_batch([m.receipt or "" for m in msgs])).failed == 0


async def test_push_mode_delivers_when_the_bell_rings(
    moto_settings: Settings, sidecars: SidecarFactory
) -> None:
    await create_topics(moto_settings, "orders", partitions=2)
    arrived: asyncio.Queue[tuple[float, object]] = asyncio.Queue()

    async def handle(msg: DeliveredMessage) -> str:
        arrived.put_nowait((time.monotonic(), msg.payload))
        return "SUCCESS"

    async with PushServer(handle, port=0) as app:
        sidecars(
            moto_settings,
            "rung-push",
            consumer="billing",
            topics="orders",
            delivery="push",
            app_port=app.port,
            **SLOW_POLLS,
        )
        async with Bucketq(moto_settings) as bq:
            producer = await bq.register_producer("shop")
            await asyncio.sleep(2)  # the sidecar's first looks found nothing
            for n in range(MESSAGES):
                started = time.monotonic()
                await producer.publish("orders", {"order": n})
                at, payload = await asyncio.wait_for(arrived.get(), timeout=30)
                assert payload == {"order": n}
                assert at - started < PICKUP_S, f"message {n} pushed after {at - started:.1f} s"
