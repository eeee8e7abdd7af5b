"""One schedule end to end (chaos, quiesce, final snapshot, check), and batches of seeds.

Phases of a run, all in virtual time:

1. **chaos** (``schedule.chaos_s``): the admin creates the topics; producers, members, the GC timer,
   the operator and the job committers run their plans while the store injects faults;
2. **quiesce**: no new faults (pauses already running end on time), crashed processes restart at
   once, producers finish what they have in flight, committers finish their jobs' runs, every
   group has a member and every member acks everything it gets; it ends when every covered
   acknowledged publish and committed job was delivered (and every job a group saw part of, all of
   it) and no settlement is open, or after ``schedule.quiesce_s`` (plus any pause still running);
3. **final**: every process is stopped; each live member's cursor replicas are caught up and
   recorded, then fresh loads of every cursor log and the segments left in the bucket.

The history is frozen before the loop is torn down, so teardown order cannot change it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import re
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bucketq.core.cursor_log import CursorLog
from bucketq.core.fences import read_fence
from bucketq.core.keys import Keys
from bucketq.core.models import TopicConfig
from bucketq.core.refsegment import load_segment
from bucketq.core.topics import TopicCatalog
from bucketq.storage import Storage

from . import checker
from .actors import GcRole, MemberRole, OperatorRole, ProducerRole, Sim, topic_config
from .clock import EPOCH, SimLoop, VirtualClock, seeded_entropy, virtual_time
from .faults import SimStore
from .history import Event, History, digest
from .jobs import JobRole, TxnJournal
from .process import Processes, current_skew
from .schedule import MemberPlan, Schedule, make_schedule
from .triage import classify
from .vandal import VandalRole

_SEGMENT = re.compile(r"^(?P<topic>[^/_][^/]*)/p(?P<p>\d+)/seg/(?P<seq>\d+)\.jsonl$")
DLQ_CONSUMER = "bucketq-dlq-consumer"  # header naming the group a dead-letter copy is from
_CURSOR = re.compile(r"^(?P<topic>[^/_][^/]*)/subs/(?P<group>[^/]+)/p(?P<p>\d+)/")


@dataclass
class RunResult:
    """What one schedule did and what the checker found."""

    seed: int
    family: str
    violations: list[checker.Violation]
    digest: str
    injected: dict[str, int]
    coverage: dict[str, int]
    wall_s: float
    virtual_s: float
    error: str | None = None  # the simulator itself failed (a bug here, or a deadlock)
    flaws: list[str] = field(default_factory=list)  # triage: the known flaw classes it looks like
    events: list[Event] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations and self.error is None

    def summary(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "family": self.family,
            "ok": self.ok,
            "digest": self.digest,
            "violations": [v.to_json() for v in self.violations],
            "injected": self.injected,
            "coverage": self.coverage,
            "wall_s": round(self.wall_s, 4),
            "virtual_s": round(self.virtual_s, 1),
            "error": self.error,
            "flaws": self.flaws,
        }


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """The engine logs every retried fault; in a simulation that is noise (and time)."""
    loggers = [logging.getLogger(n) for n in ("bucketq", "asyncio")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def run_schedule(seed: int, family: str | None = None, *, schedule: Schedule | None = None) -> RunResult:
    """Run the schedule of ``seed`` (or ``schedule``) and check its history."""
    schedule = schedule or make_schedule(seed, family)
    started = time.perf_counter()
    clock = VirtualClock()
    loop = SimLoop(clock)
    history = History(clock)
    procs = Processes(loop, clock, pauses=schedule.faults.pause > 0)
    store = SimStore(TxnJournal(history), procs, history, schedule.faults, schedule.seed)
    error: str | None = None
    events: list[Event] = []
    with quiet_logs(), virtual_time(clock, current_skew), seeded_entropy(schedule.seed):
        sim = Sim(schedule, procs, store, history)
        try:
            loop.run_until_complete(_main(sim))
        except Exception:
            error = traceback.format_exc(limit=8)
        events = list(history.events)  # frozen: teardown below records nothing that counts
        _teardown(loop)
    violations = checker.check(events) if error is None else []
    return RunResult(
        flaws=classify(events, violations),
        seed=schedule.seed,
        family=schedule.family,
        violations=violations,
        digest=digest(events),
        injected=dict(sorted(store.injected.items())),
        coverage=coverage(events),
        wall_s=time.perf_counter() - started,
        virtual_s=clock.now,
        error=error,
        events=events,
    )


def _teardown(loop: SimLoop) -> None:
    for _ in range(5):
        tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        if not tasks:
            break
        for t in tasks:
            t.cancel()
        with contextlib.suppress(Exception):
            loop.run_until_complete(asyncio.wait(tasks, timeout=1.0))
    with contextlib.suppress(Exception):
        loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


async def _main(sim: Sim) -> None:
    s, history, procs = sim.schedule, sim.history, sim.procs
    history.record("run", seed=s.seed, family=s.family, epoch=EPOCH, params=s.to_json())
    admin = procs.new("admin", "admin", faultable=False)
    await procs.spawn(admin, _create_topics(sim, admin))
    members: list[MemberRole] = []
    groups = {g.name: g for g in s.groups}
    topics = {t.name: t for t in s.topics}
    for plan in s.producers:
        ProducerRole(sim, plan).start(plan.start)
    for mplan in s.members:
        role = MemberRole(sim, mplan, groups[mplan.group], topics[mplan.topic])
        members.append(role)
        role.start(mplan.start)
    if s.gc is not None:
        GcRole(sim, "gc").start(s.gc.start)
    for t in s.topics:
        seeks = [(at, g.name, target) for g in s.groups if g.topic == t.name for at, target in g.seeks]
        if t.grow or t.churn or seeks:
            OperatorRole(sim, t, [m for m in members if m.topic.name == t.name], seeks).start()
    for jplan in s.jobs:
        JobRole(sim, jplan).start(jplan.start)
    if s.foreign:
        VandalRole(sim).start()
    history.record("phase", name="chaos")
    await asyncio.sleep(s.chaos_s)
    await _quiesce(sim, members)
    history.record("phase", name="final")
    await _final(sim, members)
    history.record("phase", name="end")


async def _create_topics(sim: Sim, admin: Any) -> None:
    bq = await sim.connect()
    for t in sim.schedule.topics:
        config = topic_config(t)

        async def create(name: str = t.name, config: TopicConfig = config) -> Any:
            return await bq.create_topic(name, config=config)

        await sim.invoke(admin, "create_topic", create, topic=t.name)


async def _quiesce(sim: Sim, members: list[MemberRole]) -> None:
    s, history, clock = sim.schedule, sim.history, sim.clock
    history.record("phase", name="quiesce")
    sim.quiescing = True
    sim.store.enabled = False
    for m in members:
        m.drain = True
    for role in list(sim.roles):
        role.quiesce()
    # every group gets a member that drains (a group whose members all left keeps its backlog)
    for g in s.groups:
        mine = [m for m in members if m.group.name == g.name]
        if not any(m.running or m.suspended or m._restart is not None for m in mine):
            topic = mine[0].topic if mine else next(t for t in s.topics if t.name == g.topic)
            role = MemberRole(sim, MemberPlan(f"{g.name}.q", g.name, g.topic, max_in_flight=50), g, topic)
            role.drain = True
            members.append(role)
            role.start()
    longest_pause = max((p.paused_until for p in sim.procs.all), default=0.0)
    deadline = max(clock.now, longest_pause) + s.quiesce_s
    seen = -1
    while clock.now < deadline:
        await asyncio.sleep(5.0)
        if len(history.events) == seen:
            continue
        seen = len(history.events)
        if any(isinstance(r, ProducerRole | JobRole) and r.running for r in sim.roles):
            continue
        ix = checker.Index(history.events)
        if checker.undelivered(history.events, ix) or checker.undelivered_jobs(ix):
            continue
        # an open app call keeps the run going until it returns or is overdue (then it is a finding)
        if any(
            ix.rets.get(cid) is None
            and not ix.crashes.get(call["proc"])
            and clock.now - call["t"] - ix.paused(call["proc"], call["t"], clock.now) <= s.hang_limit_s
            for cid, call in ix.calls.items()
        ):
            continue
        break


async def _final(sim: Sim, members: list[MemberRole]) -> None:
    history = sim.history
    live = [
        (m, m.consumer) for m in members if m.consumer is not None and m.proc is not None and m.proc.alive
    ]
    for role in sim.roles:
        role.stop()
    await asyncio.sleep(1.0)  # cancellations land (their "cancelled" returns are recorded in order)
    for role, consumer in live:
        assert consumer is not None
        for topic, sub in sorted(getattr(consumer, "_subs", {}).items()):
            for partition, worker in sorted(getattr(sub, "workers", {}).items()):
                if not getattr(worker, "loaded", True):
                    continue
                try:
                    await worker.log.catch_up()
                    state = worker.log.state.to_json()
                except Exception as exc:
                    history.record(
                        "replica",
                        topic=topic,
                        group=role.group.name,
                        partition=partition,
                        member=consumer.member,
                        state=f"catch-up failed: {type(exc).__name__}: {exc}",
                    )
                    continue
                if state.get("n"):
                    history.record(
                        "replica",
                        topic=topic,
                        group=role.group.name,
                        partition=partition,
                        member=consumer.member,
                        state=state,
                        incarnation=getattr(sub, "incarnation", None),
                    )
    memory = sim.store.inner
    storage = Storage(memory, "conditional_write")
    keys = Keys("")
    stored = memory.keys()  # MemoryStore's sorted key list (a snapshot: nothing writes any more)
    logs = sorted({(m["topic"], m["group"], int(m["p"])) for k in stored if (m := _CURSOR.match(k))})
    for topic, group, partition in logs:
        incarnation = await _incarnation(storage, keys, topic)
        try:
            log = CursorLog(storage, keys, topic, group, partition, member="sim-check")
            if incarnation is not None and _fenced_cursors():  # format 4: load as a member of the topic does
                fence = TopicCatalog(storage, keys).fence(topic, incarnation)
                log = CursorLog(storage, keys, topic, group, partition, member="sim-check", topic_fence=fence)
            state = (await log.load()).to_json()
        except Exception as exc:
            state = {"error": f"{type(exc).__name__}: {exc}"}
        history.record(
            "fresh", topic=topic, group=group, partition=partition, state=state, incarnation=incarnation
        )
    for key in sim.foreign_keys:  # what the vandal dropped that bucketq never writes (I8)
        history.record("foreign", key=key, kept=await memory.head(key) is not None)
    floors: dict[tuple[str, int], int] = {}
    for key in stored:
        m = _SEGMENT.match(key)
        if m is None:
            continue
        blob = await memory.get(key)
        if blob is None:
            continue
        where = (m["topic"], int(m["p"]))
        if where not in floors:
            fence, _ = await read_fence(storage, keys.segment_floor(*where))
            floors[where] = fence.floor if fence is not None else 0
        # below the floor fence: an orphan (a put into a freed number, I1) no reader reads and GC
        # deletes; the checkers count it as stored nowhere (as the chaos checker does)
        below = {"orphan": True} if int(m["seq"]) < floors[where] else {}
        try:
            seg = await load_segment(storage, keys, blob.data)  # a job's chunks, too
        except Exception as exc:
            history.record(
                "stored",
                topic=m["topic"],
                partition=int(m["p"]),
                seq=int(m["seq"]),
                tags=[],
                dedups=[],
                error=str(exc)[:200],
                **below,
            )
            continue
        fields: dict[str, Any] = {}
        if seg.header.txn is not None:  # a job commit's chunk (visible or not: its record decides)
            fields.update(txn=seg.header.txn, chunk=seg.header.chunk)
        if any(DLQ_CONSUMER in r.headers for r in seg.records):  # dead-letter copies: for which group
            fields["dlq_for"] = [r.headers.get(DLQ_CONSUMER) for r in seg.records]
        history.record(
            "stored",
            topic=m["topic"],
            partition=int(m["p"]),
            seq=int(m["seq"]),
            tags=[r.payload for r in seg.records],
            dedups=[r.dedup_id for r in seg.records],
            keys=[r.key for r in seg.records],
            **fields,
            **below,
        )


async def _incarnation(storage: Storage, keys: Keys, topic: str) -> str | None:
    """The topic's current incarnation (None: no live marker)."""
    try:
        return (await TopicCatalog(storage, keys).marker(topic, fresh=True)).incarnation
    except Exception:
        return None


def _fenced_cursors() -> bool:
    """Whether the engine under test stamps cursor logs with the topic incarnation (format 4):
    then a fresh load refuses another incarnation's objects, as its members do (an older engine,
    run with ``--engine``, has no topic fence for cursor logs: every delta applies)."""
    import bucketq.core.topics as topics

    return hasattr(topics, "TopicFence")


def coverage(events: list[Event]) -> dict[str, int]:
    """What a run exercised (for the batch summary)."""
    c: Counter[str] = Counter()
    procs: set[str] = set()
    for e in events:
        kind = e["ev"]
        if kind == "call":
            procs.add(e["proc"])
            c[f"call:{e['op']}"] += 1
        elif kind == "ret" and e.get("recovered"):
            c["job:recovered"] += 1  # a rerun finished the pending commit of a run that died
        elif kind == "ret" and e["outcome"] == "error":
            c[f"error:{e['error']}"] += 1
        elif kind in ("crash", "restart", "deliver", "loop_died", "outage", "app_pause"):
            c[kind] += 1
        elif kind == "vandal":
            c["vandal:" + ("foreign" if e["foreign"] else "malformed")] += 1
        elif kind == "clock" and e.get("warned"):
            c["clock:warned"] += 1
        elif kind == "txn":  # job commits: transaction records written, by state
            c[f"txn:{e['state']}"] += 1
        elif kind == "pause":
            c["pause"] += 1
            if e["until"] - e["t"] > 20 * 60:
                c["pause>20min"] += 1
    c["processes"] = len(procs)
    # standing claims (I20): one token leases many messages, a claim's only one; a delivery whose
    # receipt token another message's delivery also carried came under a standing claim
    positions: dict[str, set[tuple[str, int, int, int]]] = {}
    for e in events:
        if e["ev"] == "deliver":
            tok = e["receipt"].rsplit(":", 1)[-1]
            positions.setdefault(tok, set()).add((e["topic"], e["partition"], e["seq"], e["idx"]))
    c["deliver:standing"] = sum(len(p) for p in positions.values() if len(p) > 1)
    return dict(sorted(c.items()))


# -- batches ---------------------------------------------------------------------------------------


def _run_summary(job: tuple[int, str | None]) -> dict[str, Any]:
    seed, family = job
    try:
        return run_schedule(seed, family).summary()
    except Exception:  # the schedule could not even be built or run: report, do not stop the batch
        return {
            "seed": seed,
            "family": family or "?",
            "ok": False,
            "digest": "",
            "violations": [],
            "injected": {},
            "coverage": {},
            "wall_s": 0.0,
            "virtual_s": 0.0,
            "error": traceback.format_exc(limit=8),
            "flaws": [],
        }


def run_many(
    seeds: Iterable[int],
    *,
    family: str | None = None,
    jobs: int = 1,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run ``seeds`` (in ``jobs`` processes) and return each run's summary, in seed order."""
    work = [(seed, family) for seed in seeds]
    out: list[dict[str, Any]] = []
    if jobs <= 1 or len(work) <= 1:
        for job in work:
            summary = _run_summary(job)
            out.append(summary)
            if on_result:
                on_result(summary)
        return out
    # fork: workers inherit the imported engine (and --engine's sys.path) as they are
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(jobs) as pool:
        for summary in pool.imap(_run_summary, work, chunksize=2):
            out.append(summary)
            if on_result:
                on_result(summary)
    return out
