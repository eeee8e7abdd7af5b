"""Actors: producers, consumer-group members, the GC timer and the operator, as simulated processes
(job committers are in ``jobs.py``).

A *role* is a logical actor of the deployment (``prod0.t0``, member ``g0.1``, ``gc``, ``operator``);
it runs as successive :class:`~tests.sim.process.SimProcess` incarnations. A crashed incarnation
is replaced after a restart delay by a new one that knows only what is in the bucket (a new
``Bucketq`` connection, a new consumer member id) plus what an upstream system would give it
again (the producer's list of messages still to publish).

Everything an application would observe is recorded in the history through :meth:`Sim.invoke`
(``call``/``ret`` events) and ``deliver`` events; the actors decide nothing from engine internals.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from bucketq import Bucketq, Settings
from bucketq.core import fences
from bucketq.core.fences import DELTA_TRUST_S
from bucketq.core.models import DeadLetterConfig, TopicConfig
from bucketq.core.subscriptions import SeekTarget
from bucketq.errors import BucketqError, TopicNotFound

from .pings import SimPingNetwork
from .process import CURRENT, Processes, SimProcess

# The engine's replica reload interval: a replica trusts its copy of a cursor log's trim fence this
# long (I1, I2). The gc family draws GC's delta grace as a multiple of it (schedule.GcPlan).
RELOAD_AFTER_S = DELTA_TRUST_S

if TYPE_CHECKING:
    from bucketq.core.consumer import Consumer
    from bucketq.core.message import Message

    from .faults import SimStore
    from .history import History
    from .schedule import GroupPlan, MemberPlan, ProducerPlan, Schedule, TopicPlan


class Sim:
    """What every actor of one run shares: loop, processes, store, history, schedule, phase."""

    def __init__(self, schedule: Schedule, procs: Processes, store: SimStore, history: History) -> None:
        self.schedule = schedule
        self.procs = procs
        self.store = store
        self.history = history
        self.loop = procs.loop
        self.clock = procs.clock
        self.rng = random.Random(f"actors/{schedule.seed}")
        # wake pings (I14) over a lossy network of the run's own: each connection gets a socket
        self.pings = SimPingNetwork(procs.loop, schedule.seed, store.injected)
        self.quiescing = False
        self.roles: list[Role] = []
        self.foreign_keys: list[str] = []  # objects the vandal dropped that bucketq never writes
        self.settings = Settings.from_dict(
            {
                "backend": "memory",
                "strategy": "conditional_write",
                "consumer": schedule.consumer,
                "producer": schedule.producer,
            }
        )

    def skew(self, role: str = "") -> float:
        """A new process's clock offset: the schedule's for its role, else within ±skew/2."""
        if role in self.schedule.clock_offsets:
            return float(self.schedule.clock_offsets[role])
        return (
            self.rng.uniform(-self.schedule.skew / 2, self.schedule.skew / 2) if self.schedule.skew else 0.0
        )

    async def connect(self, settings: Settings | None = None) -> Bucketq:
        bq = Bucketq(settings or self.settings, store=self.store, ping_network=self.pings.endpoint())
        await bq.open()
        # what the process learnt of its clock when it opened the bucket (I15): the checker
        # expects a warning from every process beyond the margin, and none from one within it
        clock = getattr(bq, "clock", None)
        proc = CURRENT.get()
        if proc is not None:
            self.history.record(
                "clock",
                proc=proc.name,
                offset=round(proc.skew, 6),
                warned=None if clock is None else clock.warnings > 0,
            )
        return bq

    async def invoke(
        self,
        proc: SimProcess,
        op: str,
        fn: Callable[[], Awaitable[Any]],
        result: Callable[[Any], dict[str, Any]] | None = None,
        **fields: Any,
    ) -> Any:
        """Run one application call of ``proc``, recording its start and its outcome."""
        cid = self.history.new_cid()
        self.history.record("call", cid=cid, proc=proc.name, op=op, **fields)
        try:
            value = await fn()
        except asyncio.CancelledError:
            outcome = "cancelled" if proc.stopping or proc.alive else "crashed"
            self.history.record("ret", cid=cid, outcome=outcome)
            raise
        except BucketqError as exc:
            self.history.record("ret", cid=cid, outcome="error", error=type(exc).__name__, msg=str(exc)[:200])
            raise
        except Exception as exc:  # not a documented error: an engine bug surfacing to the app
            self.history.record("ret", cid=cid, outcome="bug", error=type(exc).__name__, msg=str(exc)[:200])
            raise
        self.history.record("ret", cid=cid, outcome="ok", **(result(value) if result else {}))
        return value

    def sleep_jitter(self, lo: float, hi: float) -> Awaitable[None]:
        return asyncio.sleep(self.rng.uniform(lo, hi))


class Role:
    """A logical actor that runs as successive process incarnations (restarted after a crash)."""

    kind = "role"

    def __init__(self, sim: Sim, name: str, *, faultable: bool = True) -> None:
        self.sim = sim
        self.name = name
        self.faultable = faultable
        self.incarnation = 0
        self.proc: SimProcess | None = None
        self.finished = False  # ran to its planned end (no restart)
        self.stopped = False  # stopped by the simulator at the end of the run
        self.running = False  # an incarnation is alive and has not returned
        self._restart: asyncio.TimerHandle | None = None
        sim.roles.append(self)

    def start(self, delay: float = 0.0) -> None:
        if self._restart is not None:
            self._restart.cancel()
            self._restart = None
        if self.stopped or self.finished or self.running:
            return
        self.running = True
        self.incarnation += 1
        proc = self.sim.procs.new(
            f"{self.name}#{self.incarnation}",
            self.kind,
            skew=self.sim.skew(self.name),
            faultable=self.faultable,
        )
        proc.on_crash = self._crashed
        self.proc = proc
        if self.incarnation > 1:
            self.sim.history.record("restart", proc=proc.name, skew=round(proc.skew, 6))
        self.sim.procs.spawn(proc, self._main(proc, delay), name=proc.name)

    async def _main(self, proc: SimProcess, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        try:
            await self.run(proc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the application dies with an unexpected error: its process exits
            self.sim.history.record(
                "proc_error", proc=proc.name, error=type(exc).__name__, msg=str(exc)[:200]
            )
            self.sim.procs.crash(proc)
        finally:
            if proc is self.proc:
                self.running = False

    async def run(self, proc: SimProcess) -> None:
        raise NotImplementedError

    def _crashed(self, proc: SimProcess) -> None:
        self.sim.history.record("crash", proc=proc.name)
        if proc is self.proc:
            self.running = False
        if self.stopped or self.finished or proc is not self.proc:
            return
        lo, hi = self.sim.schedule.restart_delay
        delay = 0.0 if self.sim.quiescing else self.sim.rng.uniform(lo, hi)
        self._restart = self.sim.loop.call_later(delay, self.start, context=contextvars.Context())

    def quiesce(self) -> None:
        """Quiesce phase: a pending restart happens now."""
        if self._restart is not None:
            self._restart.cancel()
            self._restart = None
            self.start()

    def stop(self) -> None:
        self.stopped = True
        if self._restart is not None:
            self._restart.cancel()
        if self.proc is not None:
            self.sim.procs.stop(self.proc)

    async def gate(self, proc: SimProcess) -> bool:
        return await self.sim.procs.gate(proc)

    async def setup(self, proc: SimProcess, attempt: Callable[[], Awaitable[Any]]) -> Any:
        """Retry a start-up step until it succeeds (a process retries its start, or crash-loops)."""
        while True:
            await self.gate(proc)
            try:
                return await attempt()
            except BucketqError:
                await self.sim.sleep_jitter(0.5, 3.0)


class ProducerRole(Role):
    """Publishes ``plan.count`` messages (tags ``{name}.{i}``), keyed/unkeyed, some idempotent or delayed."""

    kind = "producer"

    def __init__(self, sim: Sim, plan: ProducerPlan) -> None:
        super().__init__(sim, plan.name)
        self.plan = plan
        self.rng = random.Random(f"producer/{sim.schedule.seed}/{plan.name}")
        self.next = 0
        self.retries: list[dict[str, Any]] = []  # publishes an upstream would hand again after a crash
        self.inflight: dict[str, dict[str, Any]] = {}

    def _message(self, i: int) -> dict[str, Any]:
        p, rng = self.plan, self.rng
        key: str | None = None
        if p.key_script:
            key = p.key_script[i] if i < len(p.key_script) else None
        elif p.keys and rng.random() < p.keyed:
            key = rng.choice(p.keys)
        tag = f"{p.name}.{i}"
        dedup = f"d-{tag}" if rng.random() < p.dedup else None
        delay = round(rng.uniform(0.5, 10.0), 3) if rng.random() < p.delay else None
        return {"tag": tag, "key": key, "dedup_id": dedup, "delay": delay, "tries": 0}

    async def run(self, proc: SimProcess) -> None:
        sim, p = self.sim, self.plan
        settings = sim.settings.model_copy(
            update={"producer": sim.settings.producer.model_copy(update=p.settings)}
        )
        bq = await self.setup(proc, lambda: sim.connect(settings))
        producer = await self.setup(proc, lambda: bq.register_producer(p.name))
        # an upstream hands again what the previous incarnation had not seen acknowledged
        self.retries = [*self.inflight.values(), *self.retries]
        self.inflight = {}
        slots = asyncio.Semaphore(max(1, p.burst))
        tasks: list[asyncio.Task[None]] = []
        while not sim.quiescing:
            if self.retries:
                msg = self.retries.pop(0)
            elif self.next < p.count:
                msg = self._message(self.next)
                self.next += 1
            elif any(not t.done() for t in tasks):
                await asyncio.sleep(1.0)  # a retry may still be queued by an outstanding publish
                continue
            else:
                break
            await asyncio.sleep(self.rng.uniform(*p.gap))
            await self.gate(proc)
            await slots.acquire()
            tasks.append(asyncio.get_running_loop().create_task(self._publish(proc, producer, msg, slots)))
        await asyncio.gather(*tasks, return_exceptions=True)
        self.finished = True

    async def _publish(
        self, proc: SimProcess, producer: Any, msg: dict[str, Any], slots: asyncio.Semaphore
    ) -> None:
        sim, p = self.sim, self.plan
        self.inflight[msg["tag"]] = msg
        msg["tries"] += 1
        ok = False
        try:
            await sim.invoke(
                proc,
                "publish",
                lambda: producer.publish(
                    p.topic, msg["tag"], key=msg["key"], dedup_id=msg["dedup_id"], delay=msg["delay"]
                ),
                lambda r: {
                    "partition": r.partition,
                    "seq": r.seq,
                    "index": r.index,
                    "offset": r.offset,
                    "id": r.id,
                    "duplicate": r.duplicate,
                },
                topic=p.topic,
                tag=msg["tag"],
                key=msg["key"],
                dedup_id=msg["dedup_id"],
                delay=msg["delay"],
            )
            ok = True
        except BucketqError:
            pass
        finally:
            slots.release()
            self.inflight.pop(msg["tag"], None)
        if msg["dedup_id"] is None or sim.quiescing:
            return
        # idempotent publishes are retried by the app after a failure, and sometimes repeated after
        # success (an upstream redelivery): both must store the message once
        if (not ok and msg["tries"] <= p.retry) or (ok and msg["tries"] == 1 and self.rng.random() < p.redo):
            await asyncio.sleep(self.rng.uniform(0.5, 15.0))
            self.retries.append(msg)


class MemberRole(Role):
    """One member of a consumer group: joins, polls, settles (ack/nack/extend/slow/drop/dead), leaves."""

    kind = "member"

    def __init__(self, sim: Sim, plan: MemberPlan, group: GroupPlan, topic: TopicPlan) -> None:
        super().__init__(sim, f"member.{plan.name}")
        self.plan = plan
        self.group = group
        self.topic = topic
        self.rng = random.Random(f"member/{sim.schedule.seed}/{plan.name}")
        self.consumer: Consumer | None = None
        self.drain = False  # quiesce: ack everything at once
        self.suspended = False  # the operator stops the group's members around a topic deletion
        self.left = True  # not in the group: not joined yet, suspended, or after its planned leave

    async def run(self, proc: SimProcess) -> None:
        sim, plan, group = self.sim, self.plan, self.group
        while self.suspended:
            await asyncio.sleep(1.0)
        self.left = False
        bq = await self.setup(proc, sim.connect)
        overrides: dict[str, Any] = {"max_in_flight": plan.max_in_flight}
        if group.ordered:
            overrides["ordered"] = True

        async def join() -> Consumer:
            consumer: Consumer = await sim.invoke(
                proc,
                "join",
                lambda: bq.register_consumer(
                    group.name, group.topic, start_position=group.start_position, **overrides
                ),
                lambda c: {"member": c.member},
                group=group.name,
                topic=group.topic,
                start_position=group.start_position,
                ordered=group.ordered,
            )
            return consumer

        consumer: Consumer = await self.setup(proc, join)
        self.consumer = consumer
        self._watch(proc, consumer)
        if plan.app_pauses:
            asyncio.get_running_loop().create_task(self._app_pauses(proc, consumer))
        if plan.crash_at is not None and self.incarnation == 1:
            asyncio.get_running_loop().create_task(self._crash_at(proc, plan.crash_at))
        vt = float(sim.schedule.consumer["visibility_timeout_s"])
        busy: set[asyncio.Task[None]] = set()
        while True:
            if await self.gate(proc):
                # woken from a stop (SIGCONT): the app was not necessarily polling when stopped; it
                # finishes what it was doing first, while the engine's loops already run again
                await asyncio.sleep(self.rng.uniform(0.0, 3.0))
            if self.suspended or (
                plan.leave is not None
                and sim.clock.now >= plan.leave
                and not sim.quiescing
                and not self._rejoined
            ):
                break
            if not self.drain and len(busy) >= plan.concurrency:
                # the app works on at most `concurrency` messages; the rest waits in the prefetch buffer
                # (it looks again each second: once the run drains, it polls whatever it holds)
                await asyncio.wait(list(busy), timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                continue
            try:
                msgs = await consumer.poll(
                    max_messages=plan.poll_max if not self.drain else 100,
                    wait=self.rng.uniform(*plan.poll_wait),
                )
            except TopicNotFound:
                # documented: the topic is gone (a member kept running across its deletion); the
                # consumer starts over once it is created again, and polls answer again
                await asyncio.sleep(1.0)
                continue
            except BucketqError as exc:
                # the consumer is unusable (its loop died): the process exits and is restarted
                sim.history.record("proc_error", proc=proc.name, error=type(exc).__name__, msg=str(exc)[:200])
                sim.procs.crash(proc)
                return
            await self.gate(proc)
            for m in msgs:
                d = self._deliver(proc, consumer, m)
                task = asyncio.get_running_loop().create_task(self._handle(proc, consumer, m, d, vt))
                busy.add(task)
                task.add_done_callback(busy.discard)
        self.left = True
        try:
            await sim.invoke(
                proc, "leave", consumer.close, group=group.name, topic=group.topic, member=consumer.member
            )
        except BucketqError:
            pass
        self.consumer = None
        if self.suspended:
            return  # the operator starts a new incarnation when the topic is back
        self.finished = True
        if sim.quiescing or plan.rejoin_after is not None:
            # a leave that finished after the quiesce began is undone at once: the group must drain
            self._rejoined = True
            self.finished = False
            self.drain = self.drain or sim.quiescing
            delay = 0.0 if sim.quiescing else float(plan.rejoin_after or 0.0)
            sim.loop.call_later(delay, self.start, context=contextvars.Context())

    _rejoined = False  # the planned leave happened (a member leaves once; its successor stays)

    async def _app_pauses(self, proc: SimProcess, consumer: Consumer) -> None:
        """The app stops claiming for a while (``Consumer.pause``; heartbeats go on), recorded."""
        for at, seconds in self.plan.app_pauses:
            if at > self.sim.clock.now:
                await asyncio.sleep(at - self.sim.clock.now)
            consumer.pause()
            self.sim.history.record(
                "app_pause", proc=proc.name, member=consumer.member, until=round(at + seconds, 6)
            )
            await asyncio.sleep(max(0.0, at + seconds - self.sim.clock.now))
            consumer.resume()

    async def _crash_at(self, proc: SimProcess, at: float) -> None:
        """kill -9 at ``at``: whatever the process holds stays leased until it expires."""
        await asyncio.sleep(max(0.0, at - self.sim.clock.now))
        self.sim.procs.crash(proc)

    def _watch(self, proc: SimProcess, consumer: Consumer) -> None:
        """Record the death of the consumer's background loop (an exception, not a cancellation)."""
        task = getattr(consumer, "_task", None)
        if task is None:
            return

        def done(t: asyncio.Task[Any]) -> None:
            if t.cancelled():
                return
            err = t.exception() or getattr(consumer, "_error", None)
            if err is not None:
                self.sim.history.record(
                    "loop_died",
                    proc=proc.name,
                    member=consumer.member,
                    error=type(err).__name__,
                    msg=str(err)[:300],
                )

        task.add_done_callback(done)

    def _deliver(self, proc: SimProcess, consumer: Consumer, m: Message) -> dict[str, Any]:
        return self.sim.history.record(
            "deliver",
            proc=proc.name,
            member=consumer.member,
            group=self.group.name,
            topic=m.topic,
            partition=m.partition,
            seq=m.seq,
            idx=m.index,
            tag=m.payload,
            id=m.id,
            key=m.key,
            receipt=m.receipt,
            until=round(m.lease_until, 6),
            leased_at=round(m.leased_at, 6),
            skew=round(proc.skew, 6),
            deliveries=m.deliveries,
        )

    async def _handle(
        self, proc: SimProcess, consumer: Consumer, m: Message, d: dict[str, Any], vt: float
    ) -> None:
        sim, plan, rng = self.sim, self.plan, self.rng
        ident = {
            "group": self.group.name,
            "topic": m.topic,
            "partition": m.partition,
            "seq": m.seq,
            "idx": m.index,
            "tag": m.payload,
            "receipt": m.receipt,
        }
        choice = "ack"
        if not self.drain:
            roll = rng.random() * (plan.ack + plan.nack + plan.extend + plan.slow + plan.drop + plan.dead)
            for name, weight in (
                ("ack", plan.ack),
                ("nack", plan.nack),
                ("extend", plan.extend),
                ("slow", plan.slow),
                ("drop", plan.drop),
                ("dead", plan.dead),
            ):
                if roll < weight:
                    choice = name
                    break
                roll -= weight
        try:
            if choice == "drop":
                return  # the app loses the message: its lease expires and it is redelivered
            if choice == "slow":
                await asyncio.sleep(vt * rng.uniform(1.1, 2.0))
            elif not self.drain:
                await asyncio.sleep(rng.uniform(*plan.work))
            if choice == "extend":
                await self.gate(proc)
                await sim.invoke(
                    proc,
                    "extend",
                    lambda: consumer.extend(m.receipt, vt),
                    lambda until: {"until": round(float(until), 6)},
                    seconds=vt,
                    **ident,
                )
                await asyncio.sleep(rng.uniform(0.0, vt * 0.8))
            await self.gate(proc)
            if choice == "nack":
                delay = rng.choice([0.0, 0.0, rng.uniform(0.5, 10.0)])
                await sim.invoke(
                    proc,
                    "nack",
                    lambda: m.nack(requeue=True, delay=delay),
                    requeue=True,
                    delay=delay,
                    **ident,
                )
            elif choice == "dead":
                await sim.invoke(proc, "nack", lambda: m.nack(requeue=False), requeue=False, **ident)
            else:
                await sim.invoke(proc, "ack", m.ack, **ident)
        except BucketqError:
            pass  # recorded by invoke (LeaseLost is an expected answer)


class GcRole(Role):
    """The operator's retention/GC timer: ``collect_garbage`` every interval."""

    kind = "gc"

    async def run(self, proc: SimProcess) -> None:
        sim = self.sim
        plan = sim.schedule.gc
        assert plan is not None
        bq = await self.setup(proc, sim.connect)
        options: dict[str, Any] = {}
        if plan.delta_grace_factor is not None:
            options["delta_grace_s"] = plan.delta_grace_factor * RELOAD_AFTER_S
        segment_trust = getattr(fences, "SEGMENT_TRUST_S", None)
        if plan.segment_grace_factor is not None and segment_trust is not None:
            options["segment_grace_s"] = plan.segment_grace_factor * float(segment_trust)
        rng = random.Random(f"gc/{sim.schedule.seed}/{self.incarnation}")
        while True:
            # the operator keeps collecting while the system drains, at a calmer pace
            lo, hi = plan.interval
            await asyncio.sleep(
                rng.uniform(max(lo, 30.0), max(hi, 60.0)) if sim.quiescing else rng.uniform(lo, hi)
            )
            await self.gate(proc)
            try:
                await sim.invoke(
                    proc,
                    "gc",
                    lambda: bq.collect_garbage(**options),
                    lambda r: {
                        "segments": r.segments,
                        "deltas": r.deltas,
                        "checkpoints": r.checkpoints,
                        "abandoned": list(r.abandoned_subscriptions),
                        # I15: whether it found its host clock beyond the margin (None: not told)
                        "clock_warning": getattr(r, "clock_warning", None),
                    },
                )
            except BucketqError:
                pass


class OperatorRole(Role):
    """Topic changes at planned times: partition growth, deletion (purge) and re-creation.

    Around a deletion the operator does what the docs ask: the topic's consumer members leave
    first and new ones join once the topic exists again; producers are not told anything.
    """

    kind = "operator"

    def __init__(
        self,
        sim: Sim,
        topic: TopicPlan,
        members: list[MemberRole],
        seeks: list[tuple[float, str, str]] | None = None,
    ) -> None:
        super().__init__(sim, f"operator.{topic.name}", faultable=False)
        self.topic = topic
        self.members = members
        self.seeks = seeks or []  # (at, group, "earliest" | "latest")

    async def run(self, proc: SimProcess) -> None:
        sim, topic = self.sim, self.topic
        bq = await sim.connect()
        actions: list[tuple[float, str, Any]] = [(at, "grow", n) for at, n in topic.grow]
        actions += [(at, "churn", gap) for at, gap in topic.churn]
        actions += [(at, "seek", (group, target)) for at, group, target in self.seeks]
        for at, action, arg in sorted(actions, key=lambda a: a[0]):
            if at > sim.clock.now:
                await asyncio.sleep(at - sim.clock.now)
            if sim.quiescing:
                break
            if action == "grow":
                await self._grow(proc, bq, int(arg))
            elif action == "seek":
                await self._seek(proc, bq, *arg)
            else:
                await self._churn(proc, bq, float(arg))
        self.finished = True

    async def _grow(self, proc: SimProcess, bq: Bucketq, partitions: int) -> None:
        config = await bq.catalog.config(self.topic.name)
        if partitions <= config.partitions:
            return
        new = config.model_copy(update={"partitions": partitions})
        await self.sim.invoke(
            proc,
            "grow",
            lambda: bq.update_topic(self.topic.name, new),
            topic=self.topic.name,
            partitions=partitions,
        )

    async def _seek(self, proc: SimProcess, bq: Bucketq, group: str, target: str) -> None:
        """``bucketq consumer seek`` while the group runs (its members are not told)."""
        name = self.topic.name
        to: SeekTarget = "latest" if target == "latest" else "earliest"
        try:
            await self.sim.invoke(
                proc,
                "seek",
                lambda: bq.seek(name, group, to),
                topic=name,
                group=group,
                target=target,
            )
        except BucketqError:
            pass  # recorded; an operator would run it again

    async def _churn(self, proc: SimProcess, bq: Bucketq, gap: float) -> None:
        sim, name = self.sim, self.topic.name
        stay = self.topic.members_stay  # r9: the members keep running across the deletion
        for m in self.members:
            m.suspended = not stay
        while not stay and any(m.running and not m.left for m in self.members):
            await asyncio.sleep(0.5)
        await sim.invoke(proc, "delete_topic", lambda: bq.delete_topic(name, purge=True), topic=name)
        await asyncio.sleep(gap)
        await sim.invoke(
            proc, "create_topic", lambda: bq.create_topic(name, config=topic_config(self.topic)), topic=name
        )
        for m in self.members:
            m.suspended = False
            if not m.running:
                m.finished = False
                m.start()


def topic_config(plan: TopicPlan) -> TopicConfig:
    limits = (
        {}
        if plan.subscription_timeout_s is None
        else {"subscription_timeout_seconds": plan.subscription_timeout_s}
    )
    return TopicConfig(
        partitions=plan.partitions,
        retention_seconds=plan.retention_s,
        dead_letter=DeadLetterConfig(max_deliveries=plan.max_deliveries),
        **limits,
    )
