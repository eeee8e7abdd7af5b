"""An idle sidecar is pinged (docs/protocol.md I14): a real sidecar process whose app long-polls
gets the first message after a silence at once, although its own looks are minutes apart."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from bucketq import Bucketq
from bucketq.config import Settings
from bucketq.core.keys import Keys
from bucketq.core.pings import valid_address
from tests.sidecar.sidecar_procs import SidecarFactory, create_topics

pytestmark = [pytest.mark.s3, pytest.mark.e2e]

# the sidecar's own looks at the wake object, and its fallback polls, are two minutes apart
SLOW_LOOKS = {
    "BUCKETQ_CONSUMER__IDLE_AFTER_S": "0.5",
    "BUCKETQ_CONSUMER__WAKE_POLL_MS": "120000",
    "BUCKETQ_CONSUMER__POLL_IDLE_MS": "120000",
}


async def test_an_idle_sidecar_is_pinged_and_its_long_polling_app_gets_the_message(
    moto_settings: Settings, sidecars: SidecarFactory
) -> None:
    await create_topics(moto_settings, "orders", partitions=4)
    sc = sidecars(moto_settings, "idle", consumer="billing", topics="orders", **SLOW_LOOKS)
    async with sc.aclient() as client, Bucketq(moto_settings) as bq:
        assert await client.pull(max_messages=1, wait=2) == []  # idle from here on
        prefix = Keys(moto_settings.root).members_prefix("orders", "billing")
        heartbeats = [info.key async for info in bq.storage.list(prefix)]
        assert len(heartbeats) == 1
        blob = await bq.storage.get(heartbeats[0])
        assert blob is not None
        address = json.loads(blob.data).get("wake")
        assert valid_address(address) and address.startswith("udp://127.0.0.1:"), address

        producer = await bq.register_producer("shop")
        pull = asyncio.create_task(client.pull(max_messages=1, wait=20))
        await asyncio.sleep(1.0)  # the app is long-polling
        started = time.monotonic()
        await producer.publish("orders", {"order": 1})
        msgs = await pull
        took = time.monotonic() - started
        assert [m.payload for m in msgs] == [{"order": 1}]
        assert took < 5.0, f"picked up after {took:.1f} s: the ping did not reach the sidecar"
        acked = await client.ack_batch([m.receipt or "" for m in msgs])
        assert acked.failed == 0
