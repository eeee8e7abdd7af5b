"""Concurrency: racing producers and members, and killed processes (file adapter and SeaweedFS)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bucketq.core.keys import Keys
from bucketq.core.segment import decode_segment
from tests.support.engine_helpers import Backend, drain


async def test_racing_producers_on_one_partition_lose_nothing(race_backend: Backend) -> None:
    conns = [await race_backend.connect() for _ in range(3)]
    await conns[0].create_topic("hot")
    producers = [await bq.register_producer(f"p{i}") for i, bq in enumerate(conns)]

    async def burst(p, base: int) -> list[str]:  # type: ignore[no-untyped-def]
        out = []
        for round_ in range(4):
            rs = await asyncio.gather(*(p.publish("hot", base + round_ * 10 + j) for j in range(10)))
            out += [r.id for r in rs]
        return out

    bursts = await asyncio.gather(*(burst(p, i * 1000) for i, p in enumerate(producers)))
    published = [msg_id for ids in bursts for msg_id in ids]
    bq = conns[0]
    keys = Keys(bq.settings.root)
    stored, seqs, offsets = [], [], []
    async for info in bq.storage.list(keys.segments_prefix("hot", 0)):
        blob = await bq.storage.get(info.key)
        assert blob is not None
        seg = decode_segment(blob.data)
        seqs.append(seg.header.seq)
        offsets.append((seg.header.base, seg.header.count))
        stored += [r.id for r in seg.records]
    assert sorted(stored) == sorted(published), "each acknowledged publish stored exactly once"
    assert seqs == list(range(len(seqs))), "segment sequence numbers have no gaps"
    assert all(b == prev_b + prev_c for (prev_b, prev_c), (b, _) in itertools.pairwise(offsets))


async def test_members_of_one_consumer_share_work_without_duplicates(race_backend: Backend) -> None:
    setup = await race_backend.connect()
    await setup.create_topic("work", partitions=4)
    p = await setup.register_producer("p")
    ids = {r.id for r in await asyncio.gather(*(p.publish("work", i, key=f"k{i}") for i in range(800)))}
    # heartbeats every 0.5 s: the members see each other within a second even when their joins
    # are slow (a loaded machine), so the first one cannot drain everything alone
    members = [
        await (await race_backend.connect()).register_consumer(
            "workers", "work", max_in_flight=50, heartbeat_interval_s=0.5
        )
        for _ in range(3)
    ]
    seen: dict[str, int] = {}
    per_member = [0, 0, 0]

    async def work(i: int) -> None:
        deadline = time.monotonic() + 60
        while len(seen) < 800 and time.monotonic() < deadline:
            msgs = await members[i].poll(20, 0.2)
            for m in msgs:
                seen[m.id] = seen.get(m.id, 0) + 1
                per_member[i] += 1
            await asyncio.gather(*(m.ack() for m in msgs))

    await asyncio.gather(*(work(i) for i in range(3)))
    assert set(seen) == ids
    assert max(seen.values()) == 1, "a message was delivered to two members"
    assert sum(1 for n in per_member if n > 0) >= 2, f"work was not shared: {per_member}"


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_idle_members_steal_aged_work_from_a_busy_partition(race_backend: Backend) -> None:
    setup = await race_backend.connect()
    await setup.create_topic("hot", partitions=1)
    p = await setup.register_producer("p")
    ids = {r.id for r in await asyncio.gather(*(p.publish("hot", i) for i in range(120)))}
    opts = {"max_in_flight": 5, "steal_after_s": 0.3, "foreign_poll_ms": 100}
    members = [
        await (await race_backend.connect()).register_consumer("slow", "hot", **opts) for _ in range(3)
    ]
    seen: dict[str, int] = {}
    per_member = [0, 0, 0]

    async def work(i: int) -> None:
        deadline = time.monotonic() + 90
        while len(seen) < 120 and time.monotonic() < deadline:
            for m in await members[i].poll(5, 0.2):
                seen[m.id] = seen.get(m.id, 0) + 1
                per_member[i] += 1
                await asyncio.sleep(0.05)  # a slow handler
                await m.ack()

    await asyncio.gather(*(work(i) for i in range(3)))
    assert set(seen) == ids and max(seen.values()) == 1
    assert sum(1 for n in per_member if n > 0) >= 2, f"nobody helped the partition's owner: {per_member}"


async def test_member_that_stops_without_acking_is_redelivered(race_backend: Backend) -> None:
    setup = await race_backend.connect()
    await setup.create_topic("jobs")
    p = await setup.register_producer("p")
    ids = {r.id for r in await asyncio.gather(*(p.publish("jobs", i) for i in range(5)))}
    opts = {"visibility_timeout_s": 1.0, "clock_skew_s": 0.1}
    crashing = await (await race_backend.connect()).register_consumer("c", "jobs", **opts)
    taken = await drain(crashing, 5, ack=False)
    await crashing.close(drain=False)  # like a crash: its leases are left to expire
    survivor = await (await race_backend.connect()).register_consumer("c", "jobs", **opts)
    got: dict[str, int] = {}
    deadline = time.monotonic() + 30
    while len(got) < 5 and time.monotonic() < deadline:
        for m in await survivor.poll(10, 0.3):
            got[m.id] = m.deliveries
            await m.ack()
    assert set(got) == ids == set(taken)
    assert all(d == 2 for d in got.values()), "redeliveries are counted"


CRASHING_PRODUCER = textwrap.dedent("""
    import asyncio, sys
    from bucketq import Bucketq, Settings

    async def main():
        settings = Settings.from_dict({"backend": "file", "file_path": sys.argv[1],
                                       "producer": {"linger_ms": 2}})
        async with Bucketq(settings) as bq:
            p = await bq.register_producer("doomed")
            i = 0
            while True:
                results = await asyncio.gather(*(p.publish("crash", i + j) for j in range(7)))
                for r in results:
                    print(r.id, flush=True)
                i += 7

    asyncio.run(main())
""")

HOLDING_CONSUMER = textwrap.dedent("""
    import asyncio, sys
    from bucketq import Bucketq, Settings

    async def main():
        settings = Settings.from_dict({"backend": "file", "file_path": sys.argv[1]})
        async with Bucketq(settings) as bq:
            c = await bq.register_consumer("c", "crash", visibility_timeout_s=3, clock_skew_s=0.1)
            held = 0
            while True:
                msgs = await c.poll(50, 0.5)
                held += len(msgs)
                await asyncio.gather(*(m.ack() for m in msgs[: len(msgs) // 2]))
                print("holding", held, flush=True)

    asyncio.run(main())
""")


def _spawn(code: str, bucket: Path) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    return subprocess.Popen(
        [sys.executable, "-c", code, str(bucket)], stdout=subprocess.PIPE, text=True, env=env
    )


@pytest.mark.e2e  # real processes, SIGKILLed
async def test_sigkilled_processes_lose_no_acknowledged_publish_and_leases_come_back(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    backend = Backend("file", {"backend": "file", "file_path": str(bucket)})
    bq = await backend.connect()
    await bq.create_topic("crash", partitions=2)
    producer = _spawn(CRASHING_PRODUCER, bucket)
    acked: list[str] = []
    assert producer.stdout is not None
    while len(acked) < 300:
        line = producer.stdout.readline()
        assert line, "producer died early"
        acked.append(line.strip())
    producer.send_signal(signal.SIGKILL)
    rest = producer.stdout.read().split()
    producer.wait()
    acked += rest  # lines already printed were acknowledged before the kill
    keys = Keys("")
    stored: list[str] = []
    for part in range(2):
        async for info in bq.storage.list(keys.segments_prefix("crash", part)):
            blob = await bq.storage.get(info.key)
            assert blob is not None
            stored += [r.id for r in decode_segment(blob.data).records]
    assert set(acked) <= set(stored), "an acknowledged publish was lost"
    assert len(stored) == len(set(stored)), "a message was stored twice"

    holder = _spawn(HOLDING_CONSUMER, bucket)
    assert holder.stdout is not None
    while True:
        line = holder.stdout.readline()
        assert line, "consumer died early"
        if int(line.split()[1]) >= 100:
            break
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    survivor = await bq.register_consumer("c", "crash", visibility_timeout_s=5)
    seen: dict[str, int] = {}
    redelivered = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        msgs = await survivor.poll(100, 0.3)
        for m in msgs:
            seen[m.id] = seen.get(m.id, 0) + 1
            redelivered += m.deliveries > 1
        await asyncio.gather(*(m.ack() for m in msgs))
        [stats] = await bq.stats("crash", "c")
        if stats.acked == len(stored):
            break
    [stats] = await bq.stats("crash", "c")
    assert stats.acked == len(stored) and stats.backlog == 0 and stats.in_flight == 0
    assert redelivered > 0, "the killed member's leases were redelivered"
    assert max(seen.values()) == 1
    state_json = json.dumps([s.to_json() for s in await bq.stats("crash")])
    assert '"redelivered": 0' not in state_json.split('"partitions"')[0]
