"""Pull mode end to end: publish and consume over HTTP through a real sidecar process."""

from __future__ import annotations

import time

import pytest

from bucketq import Bucketq
from bucketq.client import DeliveredMessage, message
from bucketq.config import Settings
from tests.sidecar.sidecar_procs import SidecarFactory, create_topics

pytestmark = [pytest.mark.s3, pytest.mark.e2e]


async def test_pull_end_to_end(s3_backend: Settings, sidecars: SidecarFactory) -> None:
    await create_topics(s3_backend, "orders", partitions=2)
    sc = sidecars(s3_backend, "pull", consumer="billing", topics="orders")
    async with sc.aclient() as client:
        single = await client.publish("orders", {"n": 0}, key="customer-7", headers={"trace": "abc"})
        batch = await client.publish_batch(
            "orders", [message({"n": i}) for i in range(1, 50)] + [message(data=b"\x00\x01raw")]
        )
        assert batch.failed == 0, batch
        published = {single.id} | {r.result.id for r in batch.results if r.result is not None}
        assert len(published) == 51

        got: dict[str, DeliveredMessage] = {}
        deadline = time.monotonic() + 30
        while len(got) < len(published):
            assert time.monotonic() < deadline, f"pulled {len(got)} of {len(published)} within 30s"
            msgs = await client.pull(max_messages=20, wait=2)
            assert not set(got) & {m.id for m in msgs}, "a message was delivered twice"
            got.update({m.id: m for m in msgs})
            if msgs:
                acked = await client.ack_batch([m.receipt or "" for m in msgs])
                assert acked.failed == 0, acked
        assert set(got) == published

        first = got[single.id]
        assert (first.payload, first.key, first.headers, first.deliveries) == (
            {"n": 0},
            "customer-7",
            {"trace": "abc"},
            1,
        )
        raw = [m for m in got.values() if m.data_b64 is not None]
        assert len(raw) == 1 and raw[0].data() == b"\x00\x01raw"
        assert raw[0].content_type == "application/octet-stream"
        assert await client.pull(max_messages=10, wait=0.5) == []


async def test_nack_extend_and_dead_letter(moto_settings: Settings, sidecars: SidecarFactory) -> None:
    await create_topics(moto_settings, "jobs")
    sc = sidecars(moto_settings, "jobs", consumer="worker", topics="jobs")
    async with sc.aclient() as client:
        a = await client.publish("jobs", {"job": "a"})
        b = await client.publish("jobs", {"job": "b"})
        held: dict[str, DeliveredMessage] = {}
        deadline = time.monotonic() + 20
        while len(held) < 2:
            assert time.monotonic() < deadline, f"pulled {len(held)} of 2 messages within 20s"
            held.update({m.id: m for m in await client.pull(max_messages=2, wait=2)})

        receipt_a, receipt_b = held[a.id].receipt or "", held[b.id].receipt or ""
        until = await client.extend(receipt_a, 120)
        assert until > time.time() + 100

        nacked = await client.nack(receipt_a, requeue=True)
        assert nacked.outcome == "nacked"
        again: list[DeliveredMessage] = []
        deadline = time.monotonic() + 20
        while not again:
            assert time.monotonic() < deadline, "a nacked message was not redelivered within 20s"
            again = await client.pull(max_messages=1, wait=2)
        assert again[0].id == a.id and again[0].deliveries == 2
        await client.ack(again[0].receipt or "")

        dead = await client.nack(receipt_b, requeue=False, reason="unparseable")
        assert dead.outcome == "dead_lettered"

    async with Bucketq(moto_settings) as bq:
        dlq = await bq.register_consumer("inspect", ["jobs.dlq"])
        msgs = await dlq.poll(max_messages=5, wait=10)
        assert [m.id for m in msgs] == [b.id]
        assert msgs[0].payload == {"job": "b"}
        assert msgs[0].headers["bucketq-dlq-reason"] == "unparseable"
