"""The engine end to end on every backend: memory, filesystem, moto server and SeaweedFS."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import pytest

from bucketq import LeaseLost, MessageTooLarge, TopicNotFound
from bucketq.bench.metered import MeteredStore
from bucketq.core.keys import Keys
from bucketq.errors import BucketqError, InvalidMessage, InvalidName
from bucketq.storage.strategies import build_store
from tests.support.engine_helpers import Backend, drain, memory_backend, poll_one
from tests.support.virtual_tests import on_virtual_clock


async def test_publish_consume_ack_and_stats(backend: Backend) -> None:
    bq = await backend.connect()
    assert bq.strategy == "conditional_write"  # the probe (auto) or the explicit choice
    await bq.create_topic("orders", partitions=3)
    producer = await bq.register_producer("shop")
    results = await asyncio.gather(*(producer.publish("orders", {"n": i}) for i in range(300)))
    assert len({r.id for r in results}) == 300
    assert {r.partition for r in results} <= {0, 1, 2}
    consumer = await bq.register_consumer("billing", ["orders"])
    seen = await drain(consumer, 300)
    assert set(seen) == {r.id for r in results}
    assert all(v == 1 for v in seen.values())
    await consumer.close()
    [stats] = await bq.stats("orders", "billing")
    assert (stats.messages, stats.acked, stats.backlog, stats.in_flight) == (300, 300, 0, 0)


async def test_group_commit_batches_concurrent_publishes(backend: Backend) -> None:
    # Counted by kind of key: besides one PUT per segment, a producer writes its partition's head
    # hint, touches the wake object, and heartbeats its registration a second after registering
    # (core/producer_peers.py) -- which lands inside the burst whenever the burst is slow.
    store = MeteredStore(backend.store or build_store(backend.settings()))
    bq = await backend.connect(store=store, producer={"linger_ms": 50})
    await bq.create_topic("batched")
    producer = await bq.register_producer("p")
    before = Counter(store.calls)
    results = await asyncio.gather(*(producer.publish("batched", i) for i in range(500)))
    await producer.close()  # background head hint and wake touch finish
    segments = {(r.partition, r.seq) for r in results}
    assert len(segments) <= 3, f"500 concurrent publishes took {len(segments)} segments"
    puts = {k: n for k, n in (store.calls - before).items() if k.startswith("PUT ")}
    assert puts.get("PUT segment") == len(segments), puts  # one write per segment, no conflicts
    assert puts.get("PUT head", 0) <= len({p for p, _ in segments}), puts
    assert puts.get("PUT wake", 0) <= 1, puts
    assert set(puts) <= {"PUT segment", "PUT head", "PUT wake", "PUT registry"}, puts


async def test_message_fields_round_trip(backend: Backend) -> None:
    bq = await backend.connect()
    await bq.create_topic("fields")
    p = await bq.register_producer("p")
    r1 = await p.publish("fields", {"a": [1, 2, {"b": None}]}, key="k1", headers={"h": "v"}, priority=3)
    r2 = await p.publish("fields", data=b"\x00\xffraw", content_type="image/png")
    c = await bq.register_consumer("c", "fields")
    got = {}
    while len(got) < 2:
        for m in await c.poll(10, 1.0):
            got[m.id] = m
            await m.ack()
    m1, m2 = got[r1.id], got[r2.id]
    assert (m1.payload, m1.key, dict(m1.headers), m1.priority, m1.deliveries) == (
        {"a": [1, 2, {"b": None}]},
        "k1",
        {"h": "v"},
        3,
        1,
    )
    assert m1.producer_id == p.id and m1.topic == "fields" and m1.created_at <= time.time()
    assert (m2.data, m2.content_type, m2.payload) == (b"\x00\xffraw", "image/png", None)


async def test_fan_out_each_consumer_gets_every_message(backend: Backend) -> None:
    bq = await backend.connect()
    await bq.create_topic("events", partitions=2)
    p = await bq.register_producer("p")
    ids = {r.id for r in await asyncio.gather(*(p.publish("events", i) for i in range(100)))}
    a = await bq.register_consumer("audit", "events")
    b = await bq.register_consumer("search", "events")
    assert set(await drain(a, 100)) == ids
    assert set(await drain(b, 100)) == ids


async def test_nack_requeue_redelivers_with_count(backend: Backend) -> None:
    bq = await backend.connect()
    await bq.create_topic("retry")
    p = await bq.register_producer("p")
    await p.publish("retry", "x")
    c = await bq.register_consumer("c", "retry")
    first = await poll_one(c)
    await first.nack(requeue=True)
    second = await poll_one(c)
    assert second.id == first.id
    assert second.deliveries == 2
    await second.ack()
    await second.ack()  # idempotent


async def test_nack_with_delay_hides_message(backend: Backend) -> None:
    bq = await backend.connect()
    await bq.create_topic("later")
    p = await bq.register_producer("p")
    await p.publish("later", "x")
    c = await bq.register_consumer("c", "later")
    m = await poll_one(c)
    t0 = time.time()
    await m.nack(delay=1.0)
    again = await poll_one(c, timeout=10)
    assert time.time() - t0 >= 0.95
    await again.ack()


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_delayed_publish_is_not_delivered_early(backend: Backend) -> None:
    bq = await backend.connect()
    await bq.create_topic("delayed")
    p = await bq.register_producer("p")
    t0 = time.time()
    await p.publish("delayed", "late", delay=2.0)
    await p.publish("delayed", "now")
    c = await bq.register_consumer("c", "delayed")
    received: dict[str, float] = {}
    while len(received) < 2:
        msg = await poll_one(c, timeout=15)
        received[msg.payload] = time.time()
        await msg.ack()
    # the delay counts from the publish (after t0); "now" is not held back behind it
    assert received["late"] - t0 >= 1.95
    assert received["now"] - t0 < received["late"] - t0


async def test_priority_lower_first(backend: Backend) -> None:
    bq = await backend.connect()
    await bq.create_topic("prio")
    p = await bq.register_producer("p")
    await asyncio.gather(*(p.publish("prio", i, priority=10 - i) for i in range(10)))
    c = await bq.register_consumer("c", "prio", max_in_flight=10)
    got: list[int] = []
    while len(got) < 10:
        msgs = await c.poll(10, 1.0)
        got += [m.priority for m in msgs]
        await asyncio.gather(*(m.ack() for m in msgs))
    assert got == sorted(got)


async def test_keyed_messages_stay_in_order_on_one_partition(backend: Backend) -> None:
    bq = await backend.connect()
    await bq.create_topic("keyed", partitions=4)
    p = await bq.register_producer("p")
    results = [await p.publish("keyed", i, key="customer-7") for i in range(20)]
    assert len({r.partition for r in results}) == 1
    c = await bq.register_consumer("c", "keyed", ordered=True)
    got: list[int] = []
    while len(got) < 20:
        msgs = await c.poll(20, 1.0)
        assert len(msgs) <= 1, "ordered delivery hands out one message per key at a time"
        for m in msgs:
            got.append(m.payload)
            await m.ack()
    assert got == list(range(20))


async def test_dedup_id_publishes_once_within_window(backend: Backend) -> None:
    bq = await backend.connect()
    await bq.create_topic("dedup")
    p = await bq.register_producer("p")
    first = await p.publish("dedup", {"order": 1}, dedup_id="order-1")
    again = await p.publish("dedup", {"order": 1}, dedup_id="order-1")
    other = await p.publish("dedup", {"order": 2}, dedup_id="order-2")
    assert (again.id, again.duplicate, first.duplicate) == (first.id, True, False)
    assert other.id != first.id
    info = await bq.describe_topic("dedup")
    assert info.messages == 2


async def test_start_position_latest_skips_history(backend: Backend) -> None:
    bq = await backend.connect()
    await bq.create_topic("hist")
    p = await bq.register_producer("p")
    await p.publish("hist", "old")
    c = await bq.register_consumer("newcomer", "hist", start_position="latest")
    await p.publish("hist", "new")
    m = await poll_one(c)
    assert m.payload == "new"
    await m.ack()
    assert await c.poll(10, 0.3) == []


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_stale_lease_token_is_rejected(backend: Backend) -> None:
    bq = await backend.connect()
    await bq.create_topic("leases")
    p = await bq.register_producer("p")
    await p.publish("leases", "x")
    # a lease long enough that the second holder acks within it on a loaded machine
    a = await bq.register_consumer("c", "leases", visibility_timeout_s=2.0, clock_skew_s=0.0, max_in_flight=1)
    first = await poll_one(a)
    await asyncio.sleep(2.3)  # the lease expires; the same member claims it again
    second = await poll_one(a)
    assert second.id == first.id and second.receipt != first.receipt and second.deliveries == 2
    with pytest.raises(LeaseLost, match="lease lost"):
        await first.ack()
    with pytest.raises(LeaseLost):
        await first.extend(10)
    await second.ack()


async def test_dead_letter_after_max_deliveries_exactly_as_published(backend: Backend) -> None:
    bq = await backend.connect()
    await bq.create_topic("jobs", dead_letter={"max_deliveries": 2})
    p = await bq.register_producer("p")
    sent = await p.publish("jobs", {"poison": True}, key="k", headers={"trace": "abc"})
    c = await bq.register_consumer("worker", "jobs")
    for attempt in (1, 2):
        m = await poll_one(c)
        assert m.deliveries == attempt
        await m.nack()
    dlq = await bq.register_consumer("inspect", "jobs.dlq")
    dead = await poll_one(dlq, timeout=15)
    assert (dead.id, dead.payload, dead.key, dead.created_at) == (
        sent.id,
        {"poison": True},
        "k",
        m.created_at,
    )
    assert dead.producer_id == p.id
    assert dead.headers["trace"] == "abc"
    assert dead.headers["bucketq-dlq-source-topic"] == "jobs"
    assert dead.headers["bucketq-dlq-reason"] == "max_deliveries"
    assert dead.headers["bucketq-dlq-deliveries"] == "2"
    assert dead.headers["bucketq-dlq-consumer"] == "worker"
    await dead.ack()
    assert await c.poll(10, 0.3) == []
    [stats] = await bq.stats("jobs", "worker")
    assert stats.dead_lettered == 1 and stats.backlog == 0


async def test_nack_without_requeue_dead_letters_now(backend: Backend) -> None:
    bq = await backend.connect()
    await bq.create_topic("bad")
    p = await bq.register_producer("p")
    await p.publish("bad", "reject me")
    c = await bq.register_consumer("c", "bad")
    m = await poll_one(c)
    await m.nack(requeue=False)
    dlq = await bq.register_consumer("d", "bad.dlq")
    dead = await poll_one(dlq)
    assert dead.id == m.id and dead.headers["bucketq-dlq-reason"] == "nack"


async def test_checkpoint_and_a_fresh_process_resumes(backend: Backend) -> None:
    bq = await backend.connect(consumer={"checkpoint_every": 4})
    await bq.create_topic("resume")
    p = await bq.register_producer("p")
    for i in range(30):  # many small segments and deltas
        await p.publish("resume", i)
    c = await bq.register_consumer("c", "resume", max_in_flight=3)
    first = await drain(c, 20)
    await c.close()
    keys = Keys(bq.settings.root)
    ckpts = [i.key async for i in bq.storage.list(keys.checkpoints_prefix("resume", "c", 0))]
    assert ckpts, "checkpoints were written every 4 deltas"
    # a new connection (as a restarted process) resumes where the first stopped
    bq2 = await backend.connect(consumer={"checkpoint_every": 4})
    c2 = await bq2.register_consumer("c", "resume")
    rest = await drain(c2, 30 - len(first))
    assert len(rest) == 30 - len(first) and not set(rest) & set(first)
    assert await c2.poll(10, 0.3) == []


async def test_registry_ids_are_stable(backend: Backend) -> None:
    bq = await backend.connect()
    a = await bq.register_producer("shop")
    b = await bq.register_producer("shop")
    assert a.id == b.id
    other = await bq.register_producer("other")
    assert other.id != a.id
    reg = await bq.registry.get("producer", "shop")
    assert reg is not None and reg.last_seen >= reg.created_at


# no writer runs across the deletion: its 7 s wait would prove nothing here
@pytest.mark.usefixtures("quick_topic_deletion")
async def test_topics_create_list_describe_delete(backend: Backend) -> None:
    bq = await backend.connect()
    first = await bq.create_topic("alpha", partitions=2)
    again = await bq.create_topic("alpha", partitions=5)
    assert again.config.partitions == 2 and again.created_at == first.created_at  # idempotent
    await bq.create_topic("beta")
    assert await bq.list_topics() == ["alpha", "beta"]
    p = await bq.register_producer("p")
    await p.publish("alpha", 1)
    info = await bq.describe_topic("alpha")
    assert info.messages == 1 and len(info.partitions) == 2
    from bucketq import TopicConfig

    await bq.update_topic("alpha", TopicConfig(partitions=4))
    with pytest.raises(BucketqError, match="only grow"):
        await bq.update_topic("alpha", TopicConfig(partitions=1))
    deleted = await bq.delete_topic("alpha")
    assert deleted >= 3
    assert await bq.list_topics() == ["beta"]
    with pytest.raises(TopicNotFound):
        await p.publish("alpha", 2)
    # only the partitions' floor tombstones stay: a re-created topic continues their numbers
    keys = Keys(bq.settings.root)
    left = [i.key async for i in bq.storage.list(keys.topic_prefix("alpha"))]
    assert left == [keys.segment_floor("alpha", p) for p in range(4)]
    tombstones = [json.loads((await bq.storage.get(key)).data) for key in left]  # type: ignore[union-attr]
    assert all(t["deleted"] for t in tombstones)
    assert sum(t["floor"] for t in tombstones) == 1  # the one segment ever written


async def test_bad_input_gives_clear_errors_and_changes_nothing(backend: Backend) -> None:
    bq = await backend.connect()
    with pytest.raises(InvalidName, match="DNS-1123"):
        await bq.create_topic("Bad_Name")
    with pytest.raises(TopicNotFound, match="unknown topic 'nope'"):
        await bq.register_consumer("c", "nope")
    await bq.create_topic("small", max_message_bytes=1024)
    p = await bq.register_producer("p")
    with pytest.raises(MessageTooLarge, match="1024 bytes"):
        await p.publish("small", "x" * 5000)
    with pytest.raises(InvalidMessage, match="not JSON-serialisable"):
        await p.publish("small", {"when": object()})
    with pytest.raises(TopicNotFound):
        await p.publish("nope", 1)
    ok = await p.publish("small", "fine")  # one bad message fails only its own call
    info = await bq.describe_topic("small")
    assert info.messages == 1 and ok.offset == 0


async def test_one_bad_message_fails_only_its_caller_in_a_batch(backend: Backend) -> None:
    bq = await backend.connect(producer={"linger_ms": 30})
    await bq.create_topic("mixed", max_message_bytes=256)
    p = await bq.register_producer("p")
    calls = [p.publish("mixed", i) for i in range(20)] + [p.publish("mixed", "y" * 1000)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[-1], MessageTooLarge)
    assert all(not isinstance(r, BaseException) for r in results[:-1])
    assert (await bq.describe_topic("mixed")).messages == 20


async def test_segments_are_json_lines_as_specified(backend: Backend) -> None:
    bq = await backend.connect()
    await bq.create_topic("fmt")
    p = await bq.register_producer("p")
    r = await p.publish("fmt", {"x": 1}, key="k")
    blob = await bq.storage.get(Keys(bq.settings.root).segment("fmt", r.partition, r.seq))
    assert blob is not None
    header, line = [json.loads(x) for x in blob.data.decode().strip().split("\n")]
    assert {"v", "topic", "partition", "seq", "producer_id", "created_at", "count"} <= set(header)
    assert header["v"] == 1 and header["count"] == 1
    assert {
        "id",
        "key",
        "headers",
        "payload",
        "content_type",
        "created_at",
        "producer_id",
        "priority",
        "not_before",
        "dedup_id",
    } <= set(line)


@pytest.mark.slow
async def test_listen_auto_extends_acks_on_return_and_nacks_on_error(stored_backend: Backend) -> None:
    await _listen_auto_extends_acks_and_nacks(stored_backend)


@on_virtual_clock
async def test_listen_auto_extends_acks_on_return_and_nacks_on_error_on_virtual_clock() -> None:
    """The in-memory case, on the virtual clock: the handler's 5 s and the lease timers take no
    real time (the stored backends above run the same on the real clock)."""
    backend = memory_backend()
    try:
        await _listen_auto_extends_acks_and_nacks(backend)
    finally:
        await backend.close_all()


async def _listen_auto_extends_acks_and_nacks(backend: Backend) -> None:
    bq = await backend.connect()
    await bq.create_topic("listen")
    p = await bq.register_producer("p")
    await p.publish("listen", "slow")
    await p.publish("listen", "fails-once")
    c = await bq.register_consumer("c", "listen", visibility_timeout_s=1.5, clock_skew_s=0.5)
    calls: list[tuple[str, int]] = []
    stop = asyncio.Event()

    async def handler(msg) -> None:  # type: ignore[no-untyped-def]
        calls.append((msg.payload, msg.deliveries))
        if msg.payload == "slow":
            await asyncio.sleep(5.0)  # > visibility + skew: without extensions it would be reclaimed
        elif msg.deliveries == 1:
            raise RuntimeError("transient")
        if len(calls) >= 3:
            stop.set()

    await asyncio.wait_for(c.listen(handler, concurrency=2, stop=stop), 30)
    assert sorted(calls) == [("fails-once", 1), ("fails-once", 2), ("slow", 1)]
    await asyncio.sleep(1.5)
    assert await c.poll(10, 0.5) == []  # both were acked
    [stats] = await bq.stats("listen", "c")
    assert stats.acked == 2 and stats.redelivered == 1


async def test_nack_is_idempotent_and_settling_twice_differently_is_refused(backend: Backend) -> None:
    bq = await backend.connect()
    await bq.create_topic("idem")
    p = await bq.register_producer("p")
    await p.publish("idem", 1)
    c = await bq.register_consumer("c", "idem")
    m = await poll_one(c)
    await m.nack(delay=5)
    await m.nack(delay=5)
    with pytest.raises(LeaseLost, match="already nacked"):
        await m.ack()


async def test_close_gives_back_delivered_unsettled_messages(backend: Backend) -> None:
    bq = await backend.connect()
    await bq.create_topic("handoff")
    p = await bq.register_producer("p")
    await p.publish("handoff", 1)
    first = await bq.register_consumer("g", "handoff")
    m = await poll_one(first)
    await first.close()
    second = await bq.register_consumer("g", "handoff")
    again = await poll_one(second, timeout=5)  # well before the 30 s visibility timeout
    assert again.id == m.id and again.deliveries == 2
