"""One publish, one record: ``PublishOptions`` in every publish method, ``Producer.prepare`` and
``publish_prepared`` (the sidecar and the CLI check a whole batch with the record they publish)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from bucketq import Bucketq, InvalidArgument, InvalidMessage, MessageTooLarge, PublishOptions, Settings
from bucketq.core import producer as producer_module
from bucketq.core.segment import build_record, decode_segment
from bucketq.storage import MemoryStore

OPTIONS = PublishOptions(
    key="k", headers={"h": "v"}, dedup_id="d-1", priority=-3, delay=30, content_type=None
)


@pytest.fixture
async def bq() -> AsyncIterator[Bucketq]:
    settings = Settings.from_dict(
        {"backend": "memory", "strategy": "conditional_write", "producer": {"linger_ms": 0}}
    )
    async with Bucketq(settings, store=MemoryStore()) as conn:
        await conn.create_topic("t", partitions=2, max_message_bytes=1024)
        yield conn


async def _stored_line(bq: Bucketq, topic: str, partition: int, seq: int, index: int) -> bytes:
    blob = await bq.storage.get(bq.keys.segment(topic, partition, seq))
    assert blob is not None and decode_segment(blob.data).header.codec is None
    return blob.data.split(b"\n")[1 + index]  # line 1 is the header


async def test_a_prepared_message_is_stored_byte_for_byte(bq: Bucketq) -> None:
    producer = await bq.register_producer("p")
    prepared = await producer.prepare("t", {"n": 1}, options=OPTIONS)
    assert prepared.size == len(prepared.line) and prepared.record.producer_id == producer.id
    result = await producer.publish_prepared(prepared)
    assert result.id == prepared.record.id
    assert await _stored_line(bq, "t", result.partition, result.seq, result.index) == prepared.line


async def test_options_and_keywords_publish_the_same_message(bq: Bucketq) -> None:
    producer = await bq.register_producer("p")
    before = time.time()
    by_value = await producer.prepare("t", {"n": 1}, options=OPTIONS)
    by_keywords = await producer.prepare(
        "t",
        {"n": 1},
        options=PublishOptions(key="k", headers={"h": "v"}, dedup_id="d-1", priority=-3, delay=30),
    )
    for prepared in (by_value, by_keywords):
        r = prepared.record
        assert (r.key, dict(r.headers), r.dedup_id, r.priority, r.content_type) == (
            "k",
            {"h": "v"},
            "d-1",
            -3,
            "application/json",
        )
        assert r.not_before is not None and before + 30 <= r.not_before <= time.time() + 30
    published = await producer.publish("t", {"n": 2}, options=PublishOptions(key="k", priority=5))
    same = await bq.publish("t", {"n": 3}, key="k", priority=5)
    assert published.partition == same.partition  # one key, one partition, either way


async def test_one_record_is_built_per_publish(bq: Bucketq, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str | None] = []

    def counting(*args: object, **kwargs: object) -> object:
        record = build_record(*args, **kwargs)  # type: ignore[arg-type]
        built.append(record.id)
        return record

    monkeypatch.setattr(producer_module, "build_record", counting)
    producer = await bq.register_producer("p")
    await producer.publish("t", {"n": 1}, key="a")
    await bq.publish("t", {"n": 2}, options=PublishOptions(key="b"))
    assert len(built) == 2


async def test_options_and_keywords_together_are_refused_before_anything_is_built(bq: Bucketq) -> None:
    producer = await bq.register_producer("p")
    with pytest.raises(InvalidArgument, match="not both"):
        await producer.publish("t", {"n": 1}, key="k", options=OPTIONS)
    with pytest.raises(InvalidArgument, match="not both"):
        await bq.publish("t", {"n": 1}, priority=1, options=PublishOptions())
    with pytest.raises(InvalidArgument, match="PublishOptions"):
        await producer.publish("t", {"n": 1}, options={"key": "k"})  # type: ignore[arg-type]
    assert await bq.storage.get(bq.keys.segment("t", 0, 0)) is None
    assert await bq.storage.get(bq.keys.segment("t", 1, 0)) is None


async def test_a_bad_or_oversize_message_fails_in_prepare(bq: Bucketq) -> None:
    producer = await bq.register_producer("p")
    with pytest.raises(MessageTooLarge):
        await producer.prepare("t", {"big": "x" * 2000})
    with pytest.raises(InvalidMessage):
        await producer.prepare("t", {"n": 1}, options=PublishOptions(priority="high"))  # type: ignore[arg-type]
    with pytest.raises(InvalidMessage):
        await producer.prepare("t", {"n": 1}, data=b"raw")
    # the size limit counts the record as stored, producer id included
    room = 1024 - (await producer.prepare("t", "", message_id="m", created_at=1.0)).size
    assert (await producer.prepare("t", "x" * room, message_id="m", created_at=1.0)).size == 1024
    with pytest.raises(MessageTooLarge):
        await producer.prepare("t", "x" * (room + 1), message_id="m", created_at=1.0)
