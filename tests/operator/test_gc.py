"""The operator's garbage collection timer deletes consumed, expired segments and nothing else."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from bucketq.config import Settings
from bucketq.core.app import Bucketq
from bucketq.core.keys import namespace_root
from tests.operator.harness import Kube, fast_settings, start_operator, wait_for
from tests.operator.test_consumers import consumer
from tests.operator.test_resilience import objects
from tests.operator.test_topics import ready, topic
from tests.support.servers import S3Server

pytestmark = pytest.mark.s3  # the operator reconciles against the moto server


async def produce_and_consume(engine: Settings, ns: str, publish: int, ack: int) -> None:
    settings = engine.model_copy(update={"root": namespace_root(engine.root, ns)})
    async with Bucketq(settings) as bq:
        producer = await bq.register_producer("gc-test", linger_ms=0)
        for i in range(publish):
            await producer.publish("logs", {"n": i})  # one segment each
        if ack:
            worker = await bq.register_consumer("reader", "logs", max_in_flight=1)
            acked = 0
            deadline = time.monotonic() + 30
            while acked < ack and time.monotonic() < deadline:
                for message in await worker.poll(max_messages=1, wait=0.5):
                    await message.ack()
                    acked += 1
            assert acked == ack, f"acked {acked} of {ack} messages"
            await worker.close()


def test_gc_deletes_consumed_expired_segments_only(emulator: Any, kube: Kube, moto_server: S3Server) -> None:
    ns, other = kube.namespace("gc"), kube.namespace("gc-other")
    engine = moto_server.settings(strategy="conditional_write")
    setup = start_operator(emulator.url, engine, fast_settings([ns, other]))
    try:
        for namespace in (ns, other):
            kube.create(topic(namespace, "logs", retentionSeconds=1))
            kube.create(consumer(namespace, "reader", topics=["logs"]))
            wait_for(
                lambda n=namespace: ready(kube, "consumers", n, "reader"),
                f"reader in {namespace} to be Ready",
            )
    finally:
        setup.stop()
    asyncio.run(produce_and_consume(engine, ns, publish=5, ack=3))
    asyncio.run(produce_and_consume(engine, other, publish=5, ack=3))
    time.sleep(1.1)  # let the segments pass their 1 s retention (S3 timestamps have 1 s resolution)
    segments = sorted(k for k in objects(moto_server, engine, f"{ns}/logs/p0000/seg/"))
    assert len(segments) == 5
    before = objects(moto_server, engine, "")

    # GC frees in two phases: one run raises the fences, a run after the grace deletes below them
    running = start_operator(
        emulator.url,
        engine,
        fast_settings([ns], gc_interval_s=0.5, gc_segment_grace_s=1.0, gc_delta_grace_s=1.0),
    )
    try:
        status = wait_for(
            lambda: (
                (o := kube.get("topics", ns, "logs"))
                and (o.get("status") or {}).get("garbageCollectedObjects")
                and o["status"]
            ),
            "a garbage collection that deleted something",
        )
        assert status["lastGarbageCollection"]
    finally:
        running.stop()
    after = objects(moto_server, engine, "")
    gone = set(before) - set(after)
    assert {k for k in gone if "/seg/" in k} == set(segments[:3]), "exactly the three consumed segments"
    assert all(k.startswith(f"{ns}/") for k in gone), "nothing outside the served namespace"
    assert not [k for k in gone if "/.topic" in k or "/subs/" in k or "_registry/consumers" in k], gone
    assert set(segments[3:]) <= set(after), "unconsumed segments stay"
    assert {k: v for k, v in before.items() if k.startswith(f"{other}/")} == {
        k: v for k, v in after.items() if k.startswith(f"{other}/")
    }, "the other namespace is untouched"
    text = running.operator.metrics.render().decode()
    assert f'bucketq_gc_deleted_objects_total{{kind="segments",namespace="{ns}",topic="logs"}} 3.0' in text
