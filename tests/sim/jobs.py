"""Job commits in the simulation: a write job's driver as a simulated process, and the store's journal
of transaction records.

:class:`JobRole` plays what Spark does around ``bucketq.spark.commit`` for one ``jobId``, with the
engine's own code for everything that touches the bucket:

1. **driver, before the tasks**: ``prepare_job`` settles what earlier runs of the job left (the
   job may already be committed, or a dead run's pending commit is finished or aborted);
2. **tasks** (concurrently, as Spark runs them): each writes its chunks (Arrow IPC files, the
   engine's own encoder) at their final keys ``R/{topic}/chunk/{job}/{run}/t{task}-a0/`` the way
   ``bucketq/spark/writing.py`` does, then checks the run's abort marker, and reports a
   ``TaskCommit`` of ``ChunkRef``\\ s (names, ETags, counts, time ranges);
3. **driver**: ``commit_job(cfg, commits, storage=...)`` appends one reference segment per
   partition naming the chunks, as one transaction; when a task or the commit fails,
   ``abort_job`` (what Spark calls on a failed job).

The whole run is one app call ``job`` in the history (with the job's tags); ``abort_job`` is a
call ``job_abort``. The user then runs the same ``jobId`` again (a new run id) after a gap, up to
``plan.runs`` runs: after a failure or an abort, after a crash (the role's next incarnation), and
sometimes after success (which must be a no-op). An incarnation may be killed at a planned store
call (before it is sent, or after it was applied), besides the schedule's own faults.

:class:`TxnJournal` is the in-memory bucket under the fault layer; it records every applied write
(and deletion) of a transaction record as a ``txn`` event, at the moment the store applies it. It
is the store's view, not an application's: the checker uses it to know when a job became visible.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import random
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from bucketq.core.chunks import ChunkRef, encode_chunk
from bucketq.core.ids import message_id, stable_id
from bucketq.core.keys import Keys
from bucketq.core.txn import TxnRecord
from bucketq.errors import BucketqError, StorageError
from bucketq.spark.commit import abort_job, commit_job, prepare_job
from bucketq.spark.options import WriteConfig
from bucketq.spark.runtime import delete_prefix
from bucketq.spark.writing import TaskCommit
from bucketq.storage import MemoryStore, Storage

from .actors import Role, Sim
from .faults import CallingStore

if TYPE_CHECKING:
    from .history import History
    from .process import SimProcess
    from .schedule import JobPlan

T = TypeVar("T")

_TXN_KEY = re.compile(r"^(?P<topic>[^/_][^/]*)/txn/(?P<id>[^/]+)\.json$")
_CHUNK_KEY = re.compile(r"^(?P<topic>[^/_][^/]*)/chunk/(?P<name>.+)$")
_SEGMENT_KEY = re.compile(r"^(?P<topic>[^/_][^/]*)/p(?P<partition>\d+)/seg/(?P<seq>\d+)\.jsonl$")
PRODUCER_ID = stable_id("producer", "spark")  # what the data source's driver registers
MAX_KILLS = 3  # planned kills per role: a job that keeps dying still ends


class TaskFailed(BucketqError):
    """A write task failed (Spark then fails the job and calls the writer's abort)."""


# -- the store's journal of transaction records ----------------------------------------------------


class TxnJournal(MemoryStore):
    """The simulation's bucket: a ``MemoryStore`` that records each applied transaction-record write.

    ``txn`` events carry topic, id, job, owner, state (``pending`` | ``committed`` | ``aborted`` |
    ``deleted``), reason, and per partition the seq of each reference segment (None: not landed)
    and the names of the chunks each one names (``refs``). They are recorded when the write is
    applied, whatever then happens to its response. Deletions of chunks and segments are recorded
    as ``del`` events (topic, and ``chunk`` name or ``partition``/``seq``): GC must never delete a
    committed job's chunk while the reference segment naming it is stored.
    """

    def __init__(self, history: History) -> None:
        super().__init__()
        self.history = history

    async def put(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        etag = await super().put(key, data, if_none_match=if_none_match, if_match=if_match)
        if "/txn/" in key and (m := _TXN_KEY.match(key)) is not None:
            try:
                record = TxnRecord.decode(data)
            except StorageError as exc:
                self.history.record("txn", topic=m["topic"], id=m["id"], state="corrupt", msg=str(exc)[:200])
            else:
                self.history.record(
                    "txn",
                    topic=m["topic"],
                    id=m["id"],
                    job=record.job,
                    owner=record.owner,
                    state=record.state,
                    reason=record.reason,
                    partitions={
                        str(p): [c.seq for c in part.chunks] for p, part in sorted(record.partitions.items())
                    },
                    refs={
                        str(p): [[r.name for r in c.refs] for c in part.chunks]
                        for p, part in sorted(record.partitions.items())
                    },
                )
        return etag

    async def delete(self, keys: builtins.list[str]) -> None:
        await super().delete(keys)
        for key in keys:
            if "/txn/" in key and (m := _TXN_KEY.match(key)) is not None:
                self.history.record("txn", topic=m["topic"], id=m["id"], state="deleted")
            elif "/chunk/" in key and (m := _CHUNK_KEY.match(key)) is not None:
                self.history.record("del", topic=m["topic"], chunk=m["name"])
            elif "/seg/" in key and (m := _SEGMENT_KEY.match(key)) is not None:
                self.history.record("del", topic=m["topic"], partition=int(m["partition"]), seq=int(m["seq"]))


# -- the committer's view of the store: planned kills ---------------------------------------------


class _KillingStore(CallingStore):
    """The fault layer as one committer incarnation sees it, killing it at its ``kill_at``-th call."""

    def __init__(self, sim: Sim, proc: SimProcess, kill_at: int | None, after: bool) -> None:
        self.sim = sim
        self.inner = sim.store
        self.stats = sim.store.stats
        self.proc = proc
        self.kill_at = kill_at
        self.after = after
        self.calls = 0

    async def _call(self, op: str, key: str, request: Callable[[], Awaitable[T]]) -> T:
        self.calls += 1
        planned = self.calls == self.kill_at and self.sim.store.enabled
        if planned and not self.after:
            await self._kill(op, key, "crash_before")
        result = await request()
        if planned and self.after:
            await self._kill(op, key, "crash_after")
        return result

    async def _kill(self, op: str, key: str, kind: str) -> None:
        self.sim.store.injected[kind] += 1
        self.sim.history.record("fault", proc=self.proc.name, kind=kind, op=op, key=key)
        self.sim.procs.crash(self.proc)
        await self.sim.procs.gate(self.proc)  # a dead process's call never returns (cancelled)


# -- the job's driver ------------------------------------------------------------------------------


class JobRole(Role):
    """Runs one write job (``plan.name``) until it succeeded, or its runs are used up."""

    kind = "committer"

    def __init__(self, sim: Sim, plan: JobPlan) -> None:
        super().__init__(sim, f"job.{plan.name}")
        self.plan = plan
        self.rng = random.Random(f"job/{sim.schedule.seed}/{plan.name}")
        self.tags = [f"{plan.name}.{i}" for i in range(plan.count)]
        self.runs = 0  # runs started, over every incarnation
        self.kills = 0
        self.succeeded = False

    async def run(self, proc: SimProcess) -> None:
        sim, plan, rng = self.sim, self.plan, self.rng
        kill_at: int | None = None
        if not sim.quiescing and self.kills < MAX_KILLS and rng.random() < plan.kill:
            kill_at = rng.randint(*plan.kill_calls)
            self.kills += 1
        storage = Storage(_KillingStore(sim, proc, kill_at, rng.random() < 0.5), "conditional_write")
        keys = Keys("")
        while self.runs < plan.runs:
            if self.runs > 0:
                await self._idle(rng.uniform(*plan.gap))  # the user looks at the outcome, runs it again
            await self.gate(proc)
            self.runs += 1
            if await self._run_once(proc, storage, keys):
                self.succeeded = True
                if sim.quiescing or rng.random() >= plan.redo:
                    break
            elif sim.quiescing and self.succeeded:
                break
        self.finished = True

    async def _idle(self, seconds: float) -> None:
        end = self.sim.clock.now + seconds
        while not self.sim.quiescing and self.sim.clock.now < end:
            await asyncio.sleep(min(1.0, end - self.sim.clock.now))

    async def _run_once(self, proc: SimProcess, storage: Storage, keys: Keys) -> bool:
        sim, plan, rng = self.sim, self.plan, self.rng
        run = f"{rng.getrandbits(64):016x}"
        cfg = WriteConfig(
            settings={"root": ""},
            topic=plan.topic,
            job=plan.name,
            partitions=1 + max(p for chunks in plan.tasks for p, _ in chunks),
            producer_id=PRODUCER_ID,
            compression=plan.compression,
            txn_timeout_s=plan.txn_timeout_s,
            run=run,
        )
        failing = rng.randrange(len(plan.tasks)) if not sim.quiescing and rng.random() < plan.abort else None
        first = [0]
        for chunks in plan.tasks:
            first.append(first[-1] + sum(n for _, n in chunks))

        async def task(i: int) -> TaskCommit:
            if i == failing:
                await asyncio.sleep(rng.uniform(0.0, 0.05))
                raise TaskFailed(f"task {i} of run {run} failed")
            if cfg.done is not None:
                return TaskCommit(i)  # the job was committed before: its tasks write nothing
            return await self._stage(storage, keys, cfg, i, plan.tasks[i], first[i])

        async def job() -> dict[str, Any]:
            cfg.done = await prepare_job(storage, keys, cfg)  # the driver, before any task
            # Spark runs the tasks at once; when one fails, the others go on while the job aborts
            commits = await asyncio.gather(*(task(i) for i in range(len(plan.tasks))))
            return await commit_job(cfg, list(commits), storage=storage)

        try:
            await sim.invoke(
                proc,
                "job",
                job,
                lambda r: {
                    "txn": r.get("txn"),
                    "recovered": bool(r.get("recovered")),
                    "messages": r.get("messages"),
                },
                job=plan.name,
                topic=plan.topic,
                run=run,
                tags=self.tags,
            )
            return True
        except BucketqError:
            pass
        # Spark calls the writer's abort when a task or the commit failed
        with contextlib.suppress(BucketqError):
            await sim.invoke(
                proc,
                "job_abort",
                lambda: abort_job(cfg, storage=storage),
                job=plan.name,
                topic=plan.topic,
                run=run,
            )
        return False

    async def _stage(
        self,
        storage: Storage,
        keys: Keys,
        cfg: WriteConfig,
        task: int,
        chunks: list[tuple[int, int]],
        first: int,
    ) -> TaskCommit:
        """What ``writing.write_task`` does for one task attempt, with the messages of the plan."""
        folder = f"{cfg.job}/{cfg.run}/t{task:05d}-a0"
        written: dict[int, list[ChunkRef]] = {}
        payload = 0
        i = first
        try:
            for partition, count in chunks:
                n = len(written.setdefault(partition, []))
                now = round(time.time() * 1_000_000)
                table = pa.table(
                    {
                        "id": pa.array([message_id() for _ in range(count)], pa.string()),
                        "payload": pa.array(
                            [f'"{self.plan.name}.{j}"' for j in range(i, i + count)], pa.string()
                        ),
                        "content_type": pa.array(["application/json"] * count, pa.string()),
                        "created_at": pa.array([now] * count, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                        "producer_id": pa.array([cfg.producer_id] * count, pa.string()),
                    }
                )
                i += count
                body = encode_chunk(table, compression=cfg.compression)
                name = f"{folder}/p{partition:04d}-{n:06d}.arrow"
                etag = await storage.overwrite(keys.chunk(cfg.topic, name), body)
                written[partition].append(ChunkRef(name, etag, count, len(body), now, now))
                payload += table.nbytes
            if await storage.head(keys.spark_aborted(cfg.job, cfg.run)) is not None:
                raise TaskFailed(f"write job {cfg.job} (run {cfg.run}) was aborted while this task ran")
        except BucketqError:
            with contextlib.suppress(BucketqError):
                await delete_prefix(storage, keys.chunk(cfg.topic, folder) + "/")
            raise
        return TaskCommit(task, folder, written, i - first, {}, 0.0, payload, i - first)
