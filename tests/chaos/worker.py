"""One chaos process: a role of a bucketq deployment that records what its application observes.

    python -m tests.chaos.worker ROLE RUN_DIR PROC [--group GROUP] [--drainer]

``RUN_DIR/config.json`` (written by the controller) holds the bucket settings and the plan;
``PROC`` names this process incarnation (``g1.m0#2``) and its history file
``RUN_DIR/history/PROC.jsonl``. Roles:

* ``setup``     creates the topic and every group's subscription (before any publish, so every
                acknowledged publish is covered by every group);
* ``producer``  publishes numbered messages (tag ``PROC.i``) until the ``quiesce`` flag;
* ``member``    one member of a consumer group: polls, and acks most messages, nacks some, extends
                some, sits on some past the visibility timeout, and drops a few (never settles);
                from the ``quiesce`` flag on it acks everything at once; on ``stop`` it stops
                claiming, finishes its handlers and leaves the group; on ``final`` it records its
                cursor replicas (caught up) for the convergence check;
* ``gc``        ``collect_garbage`` in a loop with the fence windows of ``BUCKETQ_FENCE_SCALE``;
* ``probe``     until ``stop``, writes each group's backlog and in-flight count (is it drained?);
* ``snapshot``  the final state: fresh loads of every cursor, floor fences, stored segments.

Flags are files in ``RUN_DIR`` (``ready``, ``quiesce``, ``stop``, ``final``, ``snapshot``): a
SIGSTOPped process sees them when it is continued, a killed one never needs to. The quiesce
helpers (drainers, probe) and the snapshot start with the others and wait for their flag, so that
their start-up is not on the run's clock.

Every line is written with a single ``write`` and no buffering, so a kill -9 leaves at most a
partial last line, and everything before it is on disk.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import logging
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from bucketq import Bucketq, Settings
from bucketq.core import fences
from bucketq.core.consumer import Consumer
from bucketq.core.cursor_log import CursorLog
from bucketq.core.keys import Keys, parse_seq
from bucketq.core.message import Message
from bucketq.core.models import DeadLetterConfig, TopicConfig
from bucketq.core.segment import decode_segment
from bucketq.errors import BucketqError, StorageError

T = TypeVar("T")
Event = dict[str, Any]


class Recorder:
    """Appends this process's events to its history file, one unbuffered ``write`` per line."""

    def __init__(self, path: Path, proc: str, epoch: float) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.proc = proc
        self.epoch = epoch
        self._cid = 0

    def record(self, ev: str, **fields: Any) -> Event:
        """``t`` is seconds since the run's epoch on the host clock every process shares."""
        event: Event = {"t": round(time.time() - self.epoch, 6), "ev": ev, "proc": self.proc, **fields}
        data = (json.dumps(event, separators=(",", ":"), default=str) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data) :]
        return event

    async def invoke(
        self,
        op: str,
        fn: Callable[[], Awaitable[T]],
        result: Callable[[T], dict[str, Any]] | None = None,
        **fields: Any,
    ) -> T:
        """One application call: ``call`` before it starts, ``ret`` with its outcome after."""
        self._cid += 1
        cid = self._cid
        self.record("call", cid=cid, op=op, **fields)
        try:
            value = await fn()
            fields = result(value) if result else {}
        except asyncio.CancelledError:
            self.record("ret", cid=cid, outcome="cancelled")
            raise
        except BucketqError as exc:
            self.record("ret", cid=cid, outcome="error", error=type(exc).__name__, msg=str(exc)[:200])
            raise
        except Exception as exc:  # not a documented error: an engine bug reaching the app
            self.record("ret", cid=cid, outcome="bug", error=type(exc).__name__, msg=str(exc)[:200])
            raise
        self.record("ret", cid=cid, outcome="ok", **fields)
        return value


class Worker:
    def __init__(self, run_dir: Path, proc: str) -> None:
        self.run_dir = run_dir
        self.proc = proc
        self.cfg: dict[str, Any] = json.loads((run_dir / "config.json").read_text())
        self.rec = Recorder(run_dir / "history" / f"{proc}.jsonl", proc, float(self.cfg["epoch"]))
        self.rng = random.Random(f"{self.cfg['seed']}/{proc}")
        self.topic: str = self.cfg["topic"]
        self.settings = Settings.from_dict(self.cfg["settings"])
        self._check_fence_scale()

    def _check_fence_scale(self) -> None:
        """Every process sharing the bucket must run with the same fence scale (fences.py); one
        that does not would make GC never free during the run, or break I1's timing argument."""
        want = 300.0 * float(self.cfg["fence_scale"])
        if abs(fences.SEGMENT_GRACE_S - want) > 1e-9:
            raise SystemExit(
                f"{self.proc}: BUCKETQ_FENCE_SCALE is not {self.cfg['fence_scale']} "
                f"(segment grace {fences.SEGMENT_GRACE_S}s)"
            )

    def flag(self, name: str) -> bool:
        return (self.run_dir / name).exists()

    async def wait_flag(self, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.flag(name) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def retry(self, fn: Callable[[], Awaitable[T]]) -> T:
        """A start-up step is retried until it succeeds, as a restarting process would."""
        while True:
            try:
                return await fn()
            except BucketqError as exc:
                logging.warning("%s: start-up step failed, retrying: %s", self.proc, exc)
                await asyncio.sleep(0.3)

    async def connect(self, *, after_setup: bool = True) -> Bucketq:
        """A connection, once the topic and its subscriptions exist (processes start while the
        setup process runs: their start-up overlaps it)."""

        async def attempt() -> Bucketq:
            return await Bucketq(self.settings).open()

        bq = await self.retry(attempt)
        if after_setup:
            await self.wait_flag("ready", timeout=120)
        return bq

    # -- roles -------------------------------------------------------------------------------------

    async def setup(self) -> None:
        bq = await self.connect(after_setup=False)
        config = TopicConfig(
            partitions=int(self.cfg["partitions"]),
            retention_seconds=float(self.cfg["retention_s"]),
            # messages are retried until acked: nothing may leave the topic except by an ack
            dead_letter=DeadLetterConfig(enabled=False),
        )
        topic = self.topic
        await self.rec.invoke("create_topic", lambda: bq.create_topic(topic, config=config), topic=topic)
        for group in self.cfg["groups"]:
            # the subscription exists (every partition's cursor started at the earliest segment)
            # before any producer starts: it covers every publish
            await self.rec.invoke(
                "join",
                functools.partial(bq.init_subscription, topic, group, "earliest"),
                lambda floors: {"floors": floors},
                group=group,
                topic=topic,
                start_position="earliest",
                ordered=False,
                how="init_subscription",
            )
        await bq.close()

    async def producer(self, role: str) -> None:
        bq = await self.connect()
        # the producer's name (hence its id) is its role's: a restarted process is the same producer
        producer = await self.retry(lambda: bq.register_producer(role))
        numbers = itertools.count()
        lo, hi = self.cfg["publish_gap_s"]
        topic = self.topic

        async def lane() -> None:
            while not self.flag("quiesce"):
                tag = f"{self.proc}.{next(numbers)}"
                try:
                    await self.rec.invoke(
                        "publish",
                        functools.partial(producer.publish, topic, tag),
                        lambda r: {
                            "partition": r.partition,
                            "seq": r.seq,
                            "index": r.index,
                            "offset": r.offset,
                            "id": r.id,
                            "duplicate": r.duplicate,
                        },
                        topic=topic,
                        tag=tag,
                        key=None,
                        dedup_id=None,
                        delay=None,
                    )
                except Exception:  # recorded; the app goes on publishing
                    await asyncio.sleep(0.2)
                await asyncio.sleep(self.rng.uniform(lo, hi))

        await asyncio.gather(*(lane() for _ in range(int(self.cfg["producer_lanes"]))))
        await bq.close()
        self.rec.record("done")

    async def gc(self) -> None:
        bq = await self.connect()
        lo, hi = self.cfg["gc_interval_s"]
        while not self.flag("stop"):
            await asyncio.sleep(self.rng.uniform(lo, hi))
            try:
                # the library's defaults, which follow BUCKETQ_FENCE_SCALE
                await self.rec.invoke(
                    "gc",
                    lambda: bq.collect_garbage(
                        segment_grace_s=fences.SEGMENT_GRACE_S, delta_grace_s=fences.DELTA_GRACE_S
                    ),
                    lambda r: {
                        "segments": r.segments,
                        "deltas": r.deltas,
                        "checkpoints": r.checkpoints,
                        "fences_raised": r.fences_raised,
                        "total": r.total,
                    },
                )
            except Exception:  # recorded; the operator's timer runs again
                pass
        await bq.close()
        self.rec.record("done")

    async def member(self, group: str, drainer: bool) -> None:
        bq = await self.connect()
        if drainer:  # a fresh member that joins when the quiesce begins
            await self.wait_flag("quiesce", timeout=24 * 3600)
        topic = self.topic
        options = dict(self.cfg["consumer"])

        async def join() -> Consumer:
            return await self.rec.invoke(
                "join",
                lambda: bq.register_consumer(group, topic, **options),
                lambda c: {"member": c.member},
                group=group,
                topic=topic,
                start_position="earliest",
                ordered=False,
            )

        consumer = await self.retry(join)
        self._watch(consumer)
        vt = float(options["visibility_timeout_s"])
        tasks: set[asyncio.Task[None]] = set()
        while not self.flag("stop"):
            drain = drainer or self.flag("quiesce")
            try:
                msgs = await consumer.poll(max_messages=10, wait=0.3)
            except BucketqError as exc:
                # the consumer is unusable (its loop died): the process exits, the controller restarts it
                self.rec.record("proc_error", error=type(exc).__name__, msg=str(exc)[:300])
                os._exit(3)
            for m in msgs:
                # recorded before the app does anything with it: a settlement always follows its delivery
                self.rec.record(
                    "deliver",
                    member=consumer.member,
                    group=group,
                    topic=m.topic,
                    partition=m.partition,
                    seq=m.seq,
                    idx=m.index,
                    tag=m.payload,
                    key=m.key,
                    id=m.id,
                    receipt=m.receipt,
                    until=round(m.lease_until, 6),
                    skew=0.0,
                    deliveries=m.deliveries,
                    wall=round(time.time(), 6),
                )
                task = asyncio.get_running_loop().create_task(self._handle(consumer, group, m, vt, drain))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        consumer.pause()
        if tasks:
            _done, late = await asyncio.wait(tasks, timeout=2 * vt)
            for task in late:
                task.cancel()
        with contextlib.suppress(BucketqError):
            await self.rec.invoke(
                "leave", lambda: consumer.close(drain=True), group=group, topic=topic, member=consumer.member
            )
        self.rec.record("idle", member=consumer.member)
        # every member has left (no cursor writer is left) before the controller sets "final"
        await self.wait_flag("final", timeout=120)
        for sub_topic, sub in sorted(consumer._subs.items()):
            for partition, worker in sorted(sub.workers.items()):
                if not worker.loaded:
                    continue
                try:
                    await worker.log.catch_up()
                    state: Any = worker.log.state.to_json()
                except Exception as exc:
                    state = f"catch-up failed: {type(exc).__name__}: {exc}"
                if not isinstance(state, dict) or state.get("n"):
                    self.rec.record(
                        "replica",
                        topic=sub_topic,
                        group=group,
                        partition=partition,
                        member=consumer.member,
                        state=state,
                    )
        await bq.close()

    def _watch(self, consumer: Consumer) -> None:
        """Record the death of the consumer's background loop (an exception, not a cancellation)."""
        task = consumer._task
        if task is None:
            return

        def done(t: asyncio.Task[None]) -> None:
            if t.cancelled():
                return
            err = t.exception() or consumer._error
            if err is not None:
                self.rec.record(
                    "loop_died", member=consumer.member, error=type(err).__name__, msg=str(err)[:300]
                )

        task.add_done_callback(done)

    def _observe(self, m: Message, given: dict[str, float]) -> None:
        """Record ``Message.lease_until`` when it rose since last seen (a prefetch extend that
        committed after the hand-out): the checker holds the member to its latest deadline."""
        if m.lease_until > given[m.receipt] + 1e-6:
            given[m.receipt] = m.lease_until
            self.rec.record("lease", receipt=m.receipt, until=round(m.lease_until, 6))

    async def _handle(self, consumer: Consumer, group: str, m: Message, vt: float, drain: bool) -> None:
        rng, plan = self.rng, self.cfg["member_plan"]
        given = {m.receipt: m.lease_until}
        ident = {
            "group": group,
            "topic": m.topic,
            "partition": m.partition,
            "seq": m.seq,
            "idx": m.index,
            "tag": m.payload,
            "receipt": m.receipt,
            "member": consumer.member,
        }
        choice = "ack"
        if not drain:
            choice = rng.choices(list(plan), weights=list(plan.values()))[0]
        try:
            if choice == "drop":
                return  # the app loses it: its lease expires and another member gets it
            if choice == "slow":
                await asyncio.sleep(vt * rng.uniform(1.1, 1.6))  # past the lease: the ack may be refused
            elif not drain:
                await asyncio.sleep(rng.uniform(0.0, 0.05))
            if choice == "extend":
                # the deadline the app now holds is Message.lease_until, which moves on a committed extend
                await self.rec.invoke(
                    "extend",
                    lambda: m.extend(vt),
                    lambda _: {"until": round(m.lease_until, 6)},
                    seconds=vt,
                    **ident,
                )
                given[m.receipt] = max(given[m.receipt], m.lease_until)  # the extend's return says so
                await asyncio.sleep(rng.uniform(0.0, vt * 0.6))
            self._observe(m, given)
            if choice == "nack":
                delay = rng.choice([0.0, round(rng.uniform(0.2, 1.0), 3)])
                await self.rec.invoke(
                    "nack", lambda: m.nack(requeue=True, delay=delay), requeue=True, delay=delay, **ident
                )
            else:
                await self.rec.invoke("ack", m.ack, **ident)
        except Exception:  # recorded by invoke (LeaseLost is an expected answer)
            pass

    async def probe(self) -> None:
        """Until ``stop``: each group's backlog, in-flight and delayed counts, with the time the
        look began (a probe that began before the last producer exited proves nothing)."""
        bq = await self.connect()
        await self.wait_flag("quiesce", timeout=24 * 3600)
        path = self.run_dir / "probe" / f"{self.proc}.json"
        while not self.flag("stop"):
            began = round(time.time() - self.rec.epoch, 6)
            groups = {}
            try:
                for s in await bq.stats(self.topic):
                    groups[s.consumer] = {
                        "messages": s.messages,
                        "backlog": s.backlog,
                        "in_flight": s.in_flight,
                        "delayed": s.delayed,
                        "acked": s.acked,
                    }
            except BucketqError as exc:
                logging.warning("probe failed: %s", exc)
                continue
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"t": began, "groups": groups}))
            tmp.replace(path)  # the controller never reads half a file
            await asyncio.sleep(0.3)
        await bq.close()

    async def snapshot(self) -> None:
        bq = await self.connect()
        # started with the others (its start-up is off the clock); it looks once every member has
        # left and exited
        await self.wait_flag("snapshot", timeout=24 * 3600)
        storage, keys, topic = bq.storage, Keys(self.settings.root), self.topic
        for group in self.cfg["groups"]:
            for p in range(int(self.cfg["partitions"])):
                try:
                    state: Any = (
                        await CursorLog(storage, keys, topic, group, p, member="chaos-check").load()
                    ).to_json()
                except Exception as exc:
                    state = {"error": f"{type(exc).__name__}: {exc}"}
                self.rec.record("fresh", topic=topic, group=group, partition=p, state=state)
        for p in range(int(self.cfg["partitions"])):
            fence, _ = await fences.read_fence(storage, keys.segment_floor(topic, p))
            self.rec.record("fence", topic=topic, partition=p, floor=fence.floor if fence else 0)
            async for info in storage.list(keys.segments_prefix(topic, p)):
                blob = await storage.get(info.key)
                if blob is None:
                    continue
                try:
                    seg = decode_segment(blob.data)
                except (
                    StorageError
                ) as exc:  # recorded as found: what the engine makes of it is judged elsewhere
                    self.rec.record(
                        "stored",
                        topic=topic,
                        partition=p,
                        seq=parse_seq(info.key),
                        tags=[],
                        dedups=[],
                        corrupt=f"{exc} ({len(blob.data)} bytes)",
                    )
                    continue
                self.rec.record(
                    "stored",
                    topic=topic,
                    partition=p,
                    seq=parse_seq(info.key),
                    tags=[r.payload for r in seg.records],
                    dedups=[r.dedup_id for r in seg.records],
                )
        try:
            for s in await bq.stats(topic):
                self.rec.record(
                    "stats",
                    group=s.consumer,
                    backlog=s.backlog,
                    in_flight=s.in_flight,
                    delayed=s.delayed,
                    messages=s.messages,
                    acked=s.acked,
                    redelivered=s.redelivered,
                )
        except Exception as exc:  # the engine's own statistics failed: an application-visible error
            self.rec.record("stats_failed", error=type(exc).__name__, msg=str(exc)[:300])
        await bq.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.worker")
    parser.add_argument("role", choices=["setup", "producer", "member", "gc", "probe", "snapshot"])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("proc")
    parser.add_argument("--group")
    parser.add_argument("--drainer", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    w = Worker(args.run_dir, args.proc)
    role_name = args.proc.split("#")[0]
    jobs: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
        "setup": w.setup,
        "producer": lambda: w.producer(role_name),
        "member": lambda: w.member(args.group, args.drainer),
        "gc": w.gc,
        "probe": w.probe,
        "snapshot": w.snapshot,
    }
    try:
        asyncio.run(jobs[args.role]())
    except Exception as exc:
        # the application dies of an unexpected error: recorded, and an engine_alive violation
        w.rec.record("proc_error", error=type(exc).__name__, msg=str(exc)[:300])
        raise


if __name__ == "__main__":
    main()
