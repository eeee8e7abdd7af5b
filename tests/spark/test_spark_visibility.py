"""A read never shows part of a job (I17): the two races of issue 24, made deterministic.

The planner and the commit run on one event loop over the file backend; a hook in the store
(the fault layer's, ``FaultyStore``) holds a request until the other side has done its step:

1. *A read planned while a job commits* (the record turns ``committed`` between a partition's
   LIST and the planner's look at the records): the job shows whole or not at all.
2. *A pending transaction's start inside a committed one* (two jobs commit at once; B's driver
   dies with B pending): planned reads show all of A; a stream never ends inside A.

No JVM: the data source's planner and executor code are called as Spark would call them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from bucketq import Bucketq, Settings
from bucketq.core.keys import Keys
from bucketq.core.txn import abort_txn, list_txns
from bucketq.spark.commit import commit_job
from bucketq.spark.options import ReadConfig, WriteConfig, settings_options
from bucketq.spark.planning import plan_read
from bucketq.spark.reader import read_split
from bucketq.spark.schema import arrow_schema, message_schema
from bucketq.spark.source import _prepare_write
from bucketq.spark.stream import BucketqStreamReader
from bucketq.spark.writing import TaskCommit, write_task
from bucketq.storage import Storage, open_storage
from bucketq.storage.faults import FaultyStore

pytestmark = [pytest.mark.spark]

ROWS = StructType([StructField("payload", StringType()), StructField("key", StringType())])
Hook = Callable[[], Awaitable[None]]


class HookedStore(FaultyStore):
    """The fault layer with hooks: ``on(op, glob, hook, skip)`` runs ``hook`` before every
    matching request after the first ``skip`` of them."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.hooks: list[list[Any]] = []

    def on(self, op: str, glob: str, hook: Hook, *, skip: int = 0) -> None:
        self.hooks.append([op, glob, hook, skip])

    async def _before(self, op: str, keys: list[str]) -> Any:
        for h in list(self.hooks):
            if h[0] == op and any(fnmatchcase(k, h[1]) for k in keys):
                if h[3] > 0:
                    h[3] -= 1
                else:
                    await h[2]()
        return await super()._before(op, keys)


def _settings(tmp_path: Path) -> Settings:
    return Settings.from_dict(
        {"backend": "file", "file_path": str(tmp_path / "b"), "strategy": "conditional_write"}
    )


async def _hooked(settings: Settings) -> tuple[Storage, HookedStore]:
    storage = await open_storage(settings)
    store = HookedStore(storage.store)
    return Storage(store, "conditional_write"), store


async def _job(
    settings: Settings, topic: str, job: str, first: int, n: int
) -> tuple[WriteConfig, list[TaskCommit]]:
    """A job's tasks have written their chunks (two tasks, rows keyed over every partition)."""
    cfg = WriteConfig.from_options(
        {**settings_options(settings), "topic": topic, "jobId": job, "batchMessages": "40"}
    )
    await _prepare_write(cfg)
    commits = []
    for task in range(2):
        rows = [
            {"payload": json.dumps({"n": i}), "key": f"k{i % 7}"} for i in range(first + task, first + n, 2)
        ]
        batch = pa.RecordBatch.from_pylist(rows, schema=arrow_schema(ROWS))
        commits.append(await asyncio.to_thread(write_task, cfg, ROWS, task, 0, iter([batch])))
    return cfg, commits


async def _read(settings: Settings, topic: str, storage: Storage | None = None) -> list[int]:
    """Every ``n`` a planned batch read shows (planned through ``storage`` when given)."""
    cfg = ReadConfig.from_options({**settings_options(settings), "topic": topic})
    if storage is None:
        async with await open_storage(settings) as own:
            plan = await plan_read(own, Keys(), cfg)
    else:
        plan = await plan_read(storage, Keys(), cfg)
    schema = message_schema()

    def run() -> list[int]:
        out: list[int] = []
        for split in plan.splits:
            for batch in read_split(cfg, schema, split):
                out += [json.loads(p)["n"] for p in batch.column("payload").to_pylist()]
        return sorted(out)

    return await asyncio.to_thread(run)


async def _create(settings: Settings, topic: str) -> None:
    async with Bucketq(settings) as bq:
        await bq.create_topic(topic, partitions=2)


async def test_a_read_planned_while_a_job_commits_shows_all_of_it_or_nothing(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    await _create(settings, "orders")
    cfg, commits = await _job(settings, "orders", "a", 0, 400)
    committer, commit_store = await _hooked(settings)
    planner, plan_store = await _hooked(settings)
    listed = asyncio.Event()
    # the commit's first segment append goes through; the others wait for the read's listing
    commit_store.on("PUT", "orders/p*/seg/*", listed.wait, skip=1)
    committing = asyncio.create_task(commit_job(cfg, list(commits), storage=committer))

    async def commit_between_the_listings() -> None:
        listed.set()
        await committing  # the job commits after partition 0 was listed, before partition 1 is

    plan_store.on("LIST", "orders/p0001/seg/*", commit_between_the_listings)
    while not await _segments(settings):  # the commit's first reference segment is in
        await asyncio.sleep(0.01)
    seen = await _read(settings, "orders", planner)
    assert seen in ([], list(range(400))), f"the read showed {len(seen)} of the job's 400 messages"
    assert await _read(settings, "orders") == list(range(400))  # committed: the next read shows it all
    await committer.close()
    await planner.close()


async def test_a_pending_transaction_never_hides_part_of_a_committed_one(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    await _create(settings, "orders")
    cfg_a, commits_a = await _job(settings, "orders", "a", 0, 400)
    cfg_b, commits_b = await _job(settings, "orders", "b", 1000, 200)
    store_a, hooks_a = await _hooked(settings)
    store_b, hooks_b = await _hooked(settings)
    a_waits, b_began = asyncio.Event(), asyncio.Event()
    hooks_a.on("PUT", "orders/p*/seg/*", a_waits.wait, skip=1)  # A: one append in, then wait

    async def b_dies() -> None:  # B's record is written (start = the tails now); its driver dies
        b_began.set()
        await asyncio.Event().wait()

    hooks_b.on("PUT", "orders/p*/seg/*", b_dies)
    a = asyncio.create_task(commit_job(cfg_a, list(commits_a), storage=store_a))
    while not await _segments(settings):  # A's first reference segment is in
        await asyncio.sleep(0.01)
    b = asyncio.create_task(commit_job(cfg_b, list(commits_b), storage=store_b))
    await b_began.wait()
    a_waits.set()
    await a  # A commits; B stays pending (as long as its timeout, or until the job runs again)
    assert [s for _, s in await _states(settings)] == ["committed", "pending"]

    assert await _read(settings, "orders") == list(range(400))  # all of A, none of B

    # a stream never ends inside A: it waits for B, then takes A whole
    stream = BucketqStreamReader(
        ReadConfig.from_options({**settings_options(settings), "topic": "orders"}, stream=True),
        message_schema(),
    )
    start = await asyncio.to_thread(stream.initialOffset)
    end = await asyncio.to_thread(stream.latestOffset, start, None)
    assert await _stream_read(stream, start, end) == []  # A cut by B's start: none of A yet
    async with await open_storage(settings) as storage:  # B times out (or the job runs again)
        await abort_txn(storage, Keys(), "orders", "b.000001", "its driver died", only_expired=False)
    later = await asyncio.to_thread(stream.latestOffset, end, None)
    assert await _stream_read(stream, end, later) == list(range(400))
    hooks_b.add(op="*", kind="error", times=None)  # B's driver is gone: nothing more of it lands
    b.cancel()
    with contextlib.suppress(BaseException):
        await b
    await store_a.close()
    await store_b.close()


async def _segments(settings: Settings) -> list[str]:
    async with await open_storage(settings) as storage:
        return [i.key async for i in storage.list("orders/p") if "/seg/" in i.key]


async def _states(settings: Settings) -> list[tuple[str, str]]:
    from bucketq.core.txn import read_all

    async with await open_storage(settings) as storage:
        ids = await list_txns(storage, Keys(), "orders")
        found = await read_all(storage, Keys(), "orders", ids)
        return [(t, found[t][0].state) for t in sorted(found)]


async def _stream_read(stream: BucketqStreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[int]:
    def run() -> list[int]:
        out: list[int] = []
        for split in stream.partitions(start, end):
            for batch in stream.read(split):
                out += [json.loads(p)["n"] for p in batch.column("payload").to_pylist()]
        return sorted(out)

    return await asyncio.to_thread(run)


async def test_a_commit_whose_answer_was_lost_stays_committed_and_keeps_its_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit's flip of the record lands but its answer is lost (found by the simulation,
    seed 27 of ``jobs``): the commit took it for a failure, Spark's abort followed and deleted the
    run's chunks, which the committed record names: consumers met missing chunks (I18). The
    commit reads the record back; an abort of a run whose record committed deletes nothing."""
    from bucketq.spark import commit as commit_module
    from bucketq.spark.commit import abort_job

    monkeypatch.setattr(commit_module, "ABORT_SWEEP_DELAY_S", 0.0)
    settings = _settings(tmp_path)
    await _create(settings, "orders")
    cfg, commits = await _job(settings, "orders", "a", 0, 100)
    storage, store = await _hooked(settings)

    async def lose_the_answer() -> None:  # the second PUT of the record is the commit's flip
        store.add(op="PUT", match="orders/txn/*", kind="drop_after_write", times=1)

    store.on("PUT", "orders/txn/*", lose_the_answer, skip=1)
    report = await commit_job(cfg, list(commits), storage=storage)
    assert store.injected["drop_after_write"] == 1
    assert report["messages"] == 100 and not report.get("skipped")
    assert [s for _, s in await _states(settings)] == ["committed"]
    chunks = [i.key async for i in storage.list("orders/chunk/")]
    assert len(chunks) == report["chunks"] > 0
    # Spark aborts a job whose commit raised: with the record committed, nothing goes
    await abort_job(cfg, storage=storage)
    assert [i.key async for i in storage.list("orders/chunk/")] == chunks
    assert await _read(settings, "orders") == list(range(100))
    await storage.close()


async def test_an_abort_deletes_the_runs_chunks_only_when_no_live_record_names_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose pending record could not be aborted (the store refused) keeps its chunks: the
    record may still commit (a rerun finishes it); once aborted, the chunks go."""
    from bucketq.spark import commit as commit_module
    from bucketq.spark.commit import abort_job

    monkeypatch.setattr(commit_module, "ABORT_SWEEP_DELAY_S", 0.0)
    settings = _settings(tmp_path)
    await _create(settings, "orders")
    cfg, commits = await _job(settings, "orders", "a", 0, 60)
    storage, store = await _hooked(settings)

    async def refuse() -> None:  # not a StorageError: writers do not retry it
        raise RuntimeError("the store refused")

    store.on("PUT", "orders/p*/seg/*", refuse)  # the commit cannot append
    store.on("PUT", "orders/txn/*", refuse, skip=1)  # nor abort the record it wrote
    with pytest.raises(Exception, match="nothing of it is visible"):
        await commit_job(cfg, list(commits), storage=storage)
    assert [s for _, s in await _states(settings)] == ["pending"]  # its abort failed too
    pending = [i.key async for i in storage.list("orders/chunk/")]
    assert pending, "the run's chunks stay while its record is pending"
    await abort_job(cfg, storage=storage)  # the record still cannot be aborted: its chunks stay
    assert [i.key async for i in storage.list("orders/chunk/")] == pending
    store.clear()
    store.hooks.clear()
    await abort_job(cfg, storage=storage)  # aborted now: nothing names them
    assert [s for _, s in await _states(settings)] == ["aborted"]
    assert [i.key async for i in storage.list("orders/chunk/")] == []
    await storage.close()
