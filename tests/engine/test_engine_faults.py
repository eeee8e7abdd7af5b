"""Failure paths: injected S3 errors, timeouts, 412s and lost responses — nothing lost or duplicated."""

from __future__ import annotations

import asyncio

import pytest

from bucketq import Bucketq, PublishTimeout
from bucketq.core.keys import Keys
from bucketq.core.segment import decode_segment
from bucketq.storage import MemoryStore
from bucketq.storage.faults import FaultyStore
from bucketq.storage.strategies import build_store
from tests.support.engine_helpers import Backend, drain


@pytest.fixture(params=["memory", pytest.param("moto", marks=pytest.mark.s3)])
async def faulty(request: pytest.FixtureRequest) -> tuple[Backend, FaultyStore]:
    if request.param == "memory":
        b = Backend("memory", {"backend": "memory", "strategy": "conditional_write"})
        inner = MemoryStore()
    else:
        server = request.getfixturevalue("moto_server")
        s = server.settings(strategy="conditional_write", s3_max_attempts=1)
        b = Backend(
            "moto",
            s.model_dump(mode="json", exclude_none=True)
            | {"s3_access_key_id": server.access_key, "s3_secret_access_key": server.secret_key},
        )
        inner = build_store(b.settings())
    store = FaultyStore(inner, seed=7)
    b.store = store
    yield b, store
    await b.close_all()


async def all_messages(bq: Bucketq, topic: str) -> list[str]:
    """Every message id stored in the topic's segments, in order (duplicates kept)."""
    keys = Keys(bq.settings.root)
    config = await bq.catalog.config(topic)
    ids = []
    for p in range(config.partitions):
        async for info in bq.storage.list(keys.segments_prefix(topic, p)):
            blob = await bq.storage.get(info.key)
            assert blob is not None
            ids += [r.id for r in decode_segment(blob.data).records]
    return ids


async def test_segment_put_errors_and_lost_responses(faulty: tuple[Backend, FaultyStore]) -> None:
    backend, store = faulty
    bq = await backend.connect()
    await bq.create_topic("t", partitions=2)
    p = await bq.register_producer("p")
    store.add(op="PUT", match="*/seg/*", kind="error", times=2)
    store.add(op="PUT", match="*/seg/*", kind="drop_after_write", times=2)
    store.add(op="PUT", match="*/seg/*", kind="timeout", times=1, latency_s=0.05)
    results = await asyncio.gather(*(p.publish("t", i) for i in range(200)))
    assert store.injected["error"] == 2 and store.injected["drop_after_write"] == 2
    stored = await all_messages(bq, "t")
    assert sorted(stored) == sorted(r.id for r in results), "every acknowledged publish stored exactly once"


async def test_forced_412_on_segments_advances_without_loss(faulty: tuple[Backend, FaultyStore]) -> None:
    backend, store = faulty
    bq = await backend.connect()
    await bq.create_topic("t")
    p = await bq.register_producer("p")
    await p.publish("t", "first")
    store.add(op="PUT", match="*/seg/*", kind="precondition", times=3)
    results = await asyncio.gather(*(p.publish("t", i) for i in range(50)))
    stored = await all_messages(bq, "t")
    assert len(stored) == 51 and {r.id for r in results} <= set(stored)


async def test_cursor_faults_keep_consumption_exactly_once(faulty: tuple[Backend, FaultyStore]) -> None:
    backend, store = faulty
    bq = await backend.connect()
    await bq.create_topic("t", partitions=2)
    p = await bq.register_producer("p")
    ids = {r.id for r in await asyncio.gather(*(p.publish("t", i) for i in range(300)))}
    store.add(op="PUT", match="*/log/*", kind="drop_after_write", times=3)
    store.add(op="PUT", match="*/log/*", kind="error", times=3)
    store.add(op="PUT", match="*/log/*", kind="precondition", times=3)
    store.add(op="GET", match="*/seg/*", kind="timeout", times=2, latency_s=0.05)
    store.add(op="GET", match="*/log/*", kind="error", times=2)
    c = await bq.register_consumer("c", "t")
    seen = await drain(c, 300, timeout=60)
    assert set(seen) == ids
    assert all(v == 1 for v in seen.values()), "no message delivered twice"
    assert store.total_injected >= 10
    [stats] = await bq.stats("t", "c")
    assert stats.acked == 300 and stats.backlog == 0


async def test_lasting_outage_fails_publish_clearly_and_recovers(faulty: tuple[Backend, FaultyStore]) -> None:
    backend, store = faulty
    bq = await backend.connect(producer={"publish_timeout_s": 0.5})
    await bq.create_topic("t")
    p = await bq.register_producer("p")
    store.add(op="PUT", match="*/seg/*", kind="error", times=None)
    with pytest.raises(PublishTimeout, match="not durable"):
        await p.publish("t", "lost?")
    assert await all_messages(bq, "t") == []  # nothing half-written
    store.clear()
    ok = await p.publish("t", "after outage")
    assert await all_messages(bq, "t") == [ok.id]
