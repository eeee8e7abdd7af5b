"""The invariants, checked by a pure function over a recorded history (see ``history.py``).

:func:`check` reads only the events (no engine, no store), so a history recorded by real processes
can be checked the same way. Times are the history's ``t`` (true time, not any process's skewed
clock); a lease's ``until`` is in its holder's clock and is converted with the holder's ``skew``.

Each invariant is one function below; its docstring is the rule it enforces.

Job commits (``bucketq/spark/commit.py`` over ``core/txn.py``; the ``job`` role of ``jobs.py``). A
job is a ``jobId`` on a topic; its messages are the tags its ``job`` calls name; it *committed*
when a run of it returned OK or the store's journal (``txn`` events) shows one of its records
written ``committed``. A group *received* a message when it was delivered to one of its members,
or dead-lettered for it. Over the quiesced run:

* **job_all_or_nothing** — a group subscribed when the job committed that received any message of
  the job received every message of it; and no message of a job that never committed (every run
  failed, was aborted or crashed, and the store never shows a commit) is ever delivered;
* **job_one_copy** — a group never receives one message of a job as two copies (two positions or
  two message ids): reruns after a success, a failure, an abort or a crash leave one visible copy;
  the store shows at most one commit per job;
* **job_committed_delivered** — a committed job is delivered to every subscription that covers it
  (a join of the group returned before the job's first run began), like an acknowledged publish;
* **job_no_pending_delivery** — readers never deliver a message of a transaction that is not
  committed: each delivered job message comes from a chunk that a record of its job, written
  ``committed`` (journal) before the delivery, names at that very seq.
* **job_chunks_kept** — (format 5: a job commit references columnar chunks) no chunk that a
  record written ``committed`` names is deleted while the reference segment naming it is still
  stored (journal ``del`` events): GC takes a job's chunks only with their segment, never a
  running or committing job's chunks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .history import Event

EPS = 1e-6
DEFAULT_HANG_LIMIT_S = 600.0
DEFAULT_MAX_DELIVERIES = 5

MsgKey = tuple[str, str, int, int, int, str]  # group, topic, partition, seq, idx, tag


@dataclass
class Violation:
    invariant: str
    message: str
    events: list[Event] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"invariant": self.invariant, "message": self.message, "events": self.events}


class Index:
    """The history, indexed the ways the invariants read it."""

    def __init__(self, events: list[Event]) -> None:
        self.events = events
        run = next((e for e in events if e["ev"] == "run"), None)
        self.params: dict[str, Any] = (run or {}).get("params", {})
        # wall-clock time at t=0: lease deadlines (``until``) are wall-clock times of their holder
        self.epoch0 = float((run or {}).get("epoch", 0.0))
        self.end = events[-1]["t"] if events else 0.0
        self.calls: dict[int, Event] = {}
        self.rets: dict[int, Event] = {}
        self.deliveries: list[Event] = []
        self.pauses: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self.crashes: dict[str, list[float]] = defaultdict(list)
        self.txns: list[Event] = []  # the store's journal of transaction records (job commits)
        self.deletes: list[Event] = []  # the store's journal of deleted chunks and segments
        self.clocks: dict[str, Event] = {}  # proc -> what it learnt of its clock at its open (I15)
        self.app_pauses: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self.outages: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self.quiesce_t: float | None = None
        for e in events:
            kind = e["ev"]
            if kind == "call":
                self.calls[e["cid"]] = e
            elif kind == "ret":
                self.rets[e["cid"]] = e
            elif kind == "deliver":
                self.deliveries.append(e)
            elif kind == "pause":
                self.pauses[e["proc"]].append((e["t"], e["until"]))
            elif kind == "crash":
                self.crashes[e["proc"]].append(e["t"])
            elif kind == "txn":
                self.txns.append(e)
            elif kind == "del":
                self.deletes.append(e)
            elif kind == "clock":
                self.clocks.setdefault(e["proc"], e)
            elif kind == "app_pause":
                self.app_pauses[e["proc"]].append((e["t"], e["until"]))
            elif kind == "outage":
                self.outages[e["proc"]].append((e["t"], e["until"]))
            elif kind == "phase" and e.get("name") == "quiesce":
                self.quiesce_t = e["t"]
        # the members' clock margin (clock_skew_s): leases between members rely on it (I4, I10)
        self.margin = float(self.params.get("consumer", {}).get("clock_skew_s", 2.0))
        self.by_op: dict[str, list[tuple[Event, Event | None]]] = defaultdict(list)
        for cid, call in self.calls.items():
            self.by_op[call["op"]].append((call, self.rets.get(cid)))
        self.lifecycle = self._lifecycle()
        self.subs = self._subscriptions()
        # per group, how far apart its members' clocks are (every process that joined it)
        offsets: dict[str, list[float]] = defaultdict(list)
        for call, _ret in self.by_op.get("join", []):
            clock = self.clocks.get(call["proc"])
            if clock is not None:
                offsets[call["group"]].append(float(clock["offset"]))
        self.spread = {g: max(o) - min(o) for g, o in offsets.items()}
        self.jobs = self._jobs()
        self._received: dict[str, set[str]] | None = None

    # -- topics: existence periods ---------------------------------------------------------------

    def _lifecycle(self) -> dict[str, list[tuple[str, float, float]]]:
        """Per topic, its successful create/delete calls as (kind, call t, return t), in order."""
        out: dict[str, list[tuple[str, float, float]]] = defaultdict(list)
        for op, kind in (("create_topic", "create"), ("delete_topic", "delete")):
            for call, ret in self.by_op.get(op, []):
                if ret is not None and ret["outcome"] == "ok":
                    out[call["topic"]].append((kind, call["t"], ret["t"]))
        for ops in out.values():
            ops.sort(key=lambda o: o[1])
        return out

    def epoch(self, topic: str, start: float, end: float) -> int | None:
        """The topic incarnation that surely existed during [start, end] (created before start, not
        being deleted before end), or None when the interval overlaps a deletion or creation."""
        ops = self.lifecycle.get(topic)
        if not ops:
            return 0  # created outside the history (a real deployment): one incarnation
        epoch = -1
        for i, (kind, _call_t, ret_t) in enumerate(ops):
            if kind != "create":
                continue
            epoch += 1
            nxt = next((o for o in ops[i + 1 :] if o[0] == "delete"), None)
            if ret_t <= start and (nxt is None or end < nxt[1]):
                return epoch
        return None

    def final_epoch(self, topic: str, epoch: int) -> bool:
        """No deletion after the epoch's creation (its subscriptions live to the end)."""
        ops = self.lifecycle.get(topic, [])
        creates = [i for i, o in enumerate(ops) if o[0] == "create"]
        if not creates:
            return True
        first = creates[epoch] if epoch < len(creates) else len(ops)
        return not any(o[0] == "delete" for o in ops[first + 1 :])

    def in_gap(self, topic: str, start: float, end: float) -> bool:
        """[start, end] lies wholly after a deletion finished and before the next creation began."""
        ops = self.lifecycle.get(topic, [])
        for i, (kind, _call_t, ret_t) in enumerate(ops):
            if kind != "delete":
                continue
            nxt = next((o for o in ops[i + 1 :] if o[0] == "create"), None)
            if ret_t <= start and (nxt is None or end < nxt[1]):
                return True
        return False

    def has_deletes(self, topic: str) -> bool:
        return any(o[0] == "delete" for o in self.lifecycle.get(topic, []))

    # -- subscriptions ---------------------------------------------------------------------------

    def _subscriptions(self) -> dict[tuple[str, str, int], float]:
        """(group, topic, epoch) -> when it surely existed: the first successful join's return."""
        out: dict[tuple[str, str, int], float] = {}
        for call, ret in self.by_op.get("join", []):
            if ret is None or ret["outcome"] != "ok":
                continue
            epoch = self.epoch(call["topic"], call["t"], ret["t"])
            if epoch is None:
                continue
            key = (call["group"], call["topic"], epoch)
            out[key] = min(out.get(key, ret["t"]), ret["t"])
        return out

    # -- job commits -----------------------------------------------------------------------------

    def _jobs(self) -> dict[tuple[str, str], Job]:
        """(topic, jobId) -> the job's runs, messages and commits."""
        out: dict[tuple[str, str], Job] = {}
        for call, ret in self.by_op.get("job", []):
            job = out.setdefault(
                (call["topic"], call["job"]), Job(call["topic"], call["job"], first_call=call["t"])
            )
            job.tags.update(call["tags"])
            job.first_call = min(job.first_call, call["t"])
            job.runs.append((call, ret))
        for e in self.txns:
            found = out.get((e["topic"], e.get("job", "")))
            if found is not None and e["state"] == "committed":
                found.commits.append(e)
        return out

    def job_of(self) -> dict[tuple[str, str], Job]:
        """(topic, tag) -> the job the message belongs to."""
        return {(j.topic, tag): j for j in self.jobs.values() for tag in j.tags}

    def received(self) -> dict[str, set[str]]:
        """group -> tags delivered to one of its members or found dead-lettered for it."""
        if self._received is None:
            got: dict[str, set[str]] = defaultdict(set)
            for d in self.deliveries:
                got[d["group"]].add(d["tag"])
            for e in self.events:
                if e["ev"] == "stored" and "dlq_for" in e:
                    for g, t in zip(e["dlq_for"], e["tags"], strict=True):
                        if g is not None:
                            got[g].add(t)
            self._received = dict(got)
        return self._received

    def subscribed_at_commit(self, job: Job) -> set[str]:
        """Groups whose subscription surely existed when the job committed (a join had returned
        before the store applied the first commit; without a journal, before the first run began)."""
        when = min((e["t"] for e in job.commits), default=job.first_call)
        epoch = self.epoch(job.topic, when, when)
        return {
            g for (g, t, e), since in self.subs.items() if t == job.topic and e == epoch and since <= when
        }

    def covering(self, job: Job) -> list[str]:
        """Groups whose subscription surely existed before the job's first run began."""
        epoch = self.epoch(job.topic, job.first_call, job.first_call)
        if epoch is None or not self.final_epoch(job.topic, epoch):
            return []
        return sorted(
            g
            for (g, t, e), since in self.subs.items()
            if t == job.topic and e == epoch and since <= job.first_call
        )

    def ordered_groups(self) -> set[tuple[str, str]]:
        return {(c["group"], c["topic"]) for c, _ in self.by_op.get("join", []) if c.get("ordered")}

    # -- helpers ---------------------------------------------------------------------------------

    def paused(self, proc: str, start: float, end: float) -> float:
        """Seconds of [start, end] during which ``proc`` was paused."""
        total = 0.0
        for p_start, p_end in self.pauses.get(proc, []):
            total += max(0.0, min(end, p_end) - max(start, p_start))
        return total

    def beyond_margin(self, d1: Event, d2: Event) -> bool:
        """Lease deadlines between members rely on their clocks being within the margin (I4,
        I10): exclusivity is not promised between two deliveries whose holders' clocks differ by
        more, nor within a group two of whose members' clocks do (a member far ahead may take a
        live lease, and hand the message back to anyone). Such clocks are reported (I15,
        ``clock_reported``)."""
        if abs(float(d1.get("skew", 0.0)) - float(d2.get("skew", 0.0))) > self.margin + EPS:
            return True
        return self.spread.get(d1["group"], 0.0) > self.margin + EPS

    def lease_end(self, d: Event, extended: float = 0.0) -> float:
        """When delivery ``d``'s lease expires, in history time (its holder's clock corrected by
        the holder's skew); ``extended`` is a later ``until`` granted by a successful extend."""
        return max(float(d["until"]), extended) - float(d.get("skew", 0.0)) - self.epoch0

    def seeks(self, group: str, topic: str) -> list[tuple[float, float, str]]:
        """An operator's seeks of ``group`` on ``topic``: (call t, return t or the end, target). One
        may have landed anywhere between its call and its return (or the end of the run)."""
        out = []
        for call, ret in self.by_op.get("seek", []):
            if call["group"] == group and call["topic"] == topic:
                if ret is not None and ret["outcome"] == "error" and ret.get("error") != "StorageTimeout":
                    continue  # refused before writing anything
                out.append((call["t"], ret["t"] if ret is not None else self.end, call["target"]))
        return out

    def publishes(self) -> list[tuple[Event, Event | None]]:
        return self.by_op.get("publish", [])


@dataclass
class Job:
    """A write job as the history shows it."""

    topic: str
    name: str
    tags: set[str] = field(default_factory=set)
    first_call: float = 0.0
    runs: list[tuple[Event, Event | None]] = field(default_factory=list)
    commits: list[Event] = field(default_factory=list)  # journal: its records written committed

    @property
    def acked(self) -> bool:
        return any(r is not None and r["outcome"] == "ok" for _, r in self.runs)

    @property
    def committed(self) -> bool:
        return self.acked or bool(self.commits)


def msg_key(e: Event) -> MsgKey:
    return (e["group"], e["topic"], int(e["partition"]), int(e["seq"]), int(e["idx"]), str(e["tag"]))


def _settlements(ix: Index) -> dict[str, list[tuple[Event, Event | None]]]:
    """receipt -> its ack/nack calls with their returns."""
    out: dict[str, list[tuple[Event, Event | None]]] = defaultdict(list)
    for op in ("ack", "nack"):
        for call, ret in ix.by_op.get(op, []):
            out[call["receipt"]].append((call, ret))
    return out


def _maybe_applied(ret: Event | None) -> bool:
    """A settlement that may have reached the log: anything but a definite 'lease lost'."""
    return ret is None or ret["outcome"] != "error" or ret.get("error") != "LeaseLost"


def _answered_after_a_seek(call: Event, ret: Event | None, seeks: list[tuple[float, float, str]]) -> bool:
    """A 'lease lost' answer that may hide an applied settlement: the settlement's delta landed with
    its response lost, and the member judged it from a state after a ``seek`` had cleared the
    window (I3 judges conservatively: the lease is gone and the message is not done, so the app is
    told its lease was lost). Only possible when a seek of the group landed before the answer."""
    return ret is not None and any(called <= ret["t"] for called, _landed, _target in seeks)


# -- the invariants --------------------------------------------------------------------------------


def undelivered(events: list[Event], ix: Index | None = None) -> list[tuple[str, Event, Event]]:
    """(group, publish call, publish return) for every covered acknowledged publish not yet delivered
    to that group (the runner's quiesce phase waits for this to be empty)."""
    ix = ix or Index(events)
    delivered = {(d["group"], d["tag"]) for d in ix.deliveries}
    # a message the janitor dead-lettered (max deliveries reached by claims the app never saw, e.g.
    # prefetches of crashed members) was settled for that group, not lost
    for e in ix.events:
        if e["ev"] == "stored" and "dlq_for" in e:
            delivered.update((g, t) for g, t in zip(e["dlq_for"], e["tags"], strict=True) if g is not None)
    # a message is as old as the first attempt to publish it: a retry answered "duplicate" (or one
    # after an unknown outcome) may name a copy written before the subscription existed
    first_try: dict[tuple[str, str], float] = {}
    for call, _ret in ix.publishes():
        key = (call["topic"], call["tag"])
        first_try[key] = min(first_try.get(key, call["t"]), call["t"])
    out = []
    for call, ret in ix.publishes():
        if ret is None or ret["outcome"] != "ok":
            continue
        topic = call["topic"]
        began = first_try[(topic, call["tag"])]
        epoch = ix.epoch(topic, call["t"], ret["t"])
        if epoch is None or not ix.final_epoch(topic, epoch):
            continue
        for (group, sub_topic, sub_epoch), since in ix.subs.items():
            if (
                sub_topic == topic
                and sub_epoch == epoch
                and since <= began
                and (group, call["tag"]) not in delivered
                and not any(  # a seek forward skips what was published before it landed
                    target == "latest" and began <= landed
                    for _called, landed, target in ix.seeks(group, topic)
                )
            ):
                out.append((group, call, ret))
    return out


def acked_publish_delivered(ix: Index) -> list[Violation]:
    """Every acknowledged publish is delivered to every subscription that covers it.

    A subscription (group, topic incarnation) covers a publish whose first attempt (retries of a
    message reuse it) started after the subscription surely existed (a join of the group had
    returned) and before any deletion of the topic. After the quiesce phase (no faults, every member draining) each such publish must
    have been delivered at least once to the group, or be found dead-lettered for that group (a
    settlement, not a loss: the janitor dead-letters after max_deliveries claims, some of which
    the app may never have seen). A publish acknowledged into a topic incarnation
    that was later deleted is not required (deletion destroys it).
    """
    return [
        Violation(
            "acked_publish_delivered",
            f"publish {call['tag']} acknowledged at p{ret.get('partition')}/seg {ret.get('seq')}/{ret.get('index')} "
            f"was never delivered to group {group}",
            [call, ret],
        )
        for group, call, ret in undelivered(ix.events, ix)
    ]


def exclusive_lease(ix: Index) -> list[Violation]:
    """Never two live leases on one message.

    A delivery's lease lives from its hand-out until the earliest of: its expiry (the latest
    ``until`` the app was given, at delivery or by a successful extend, converted from the holder's
    clock with its skew) and the start of a settlement that may have been applied (ack, nack, or
    the member leaving the group). A crashed holder's lease stays live until it expires. A delivery
    of the same message (group, position, tag) to any member while an earlier one is live is a
    violation; so is the same receipt handed out twice.
    """
    settle = _settlements(ix)
    extends: dict[str, float] = {}
    for call, ret in ix.by_op.get("extend", []):
        if ret is not None and ret["outcome"] == "ok" and "until" in ret:
            extends[call["receipt"]] = max(extends.get(call["receipt"], 0.0), float(ret["until"]))
    leaves: dict[str, float] = {}
    for call, _ret in ix.by_op.get("leave", []):
        member = call.get("member")
        if member is not None:
            leaves[member] = min(leaves.get(member, call["t"]), call["t"])
    out: list[Violation] = []
    by_msg: dict[MsgKey, list[Event]] = defaultdict(list)
    for d in ix.deliveries:
        by_msg[msg_key(d)].append(d)
    for ds in by_msg.values():
        ds.sort(key=lambda e: (e["t"], e["i"]))
        for j, d2 in enumerate(ds):
            for d1 in ds[:j]:
                if d1["receipt"] == d2["receipt"]:
                    out.append(
                        Violation("exclusive_lease", f"receipt {d1['receipt']} handed out twice", [d1, d2])
                    )
                    continue
                if ix.beyond_margin(d1, d2):
                    continue  # clocks apart beyond the margin: reported, not promised (I15)
                expiry = ix.lease_end(d1, extends.get(d1["receipt"], 0.0))
                end = expiry
                seeks = ix.seeks(d1["group"], d1["topic"])
                starts = [
                    c["t"]
                    for c, r in settle.get(d1["receipt"], [])
                    if _maybe_applied(r) or _answered_after_a_seek(c, r, seeks)
                ]
                if d1["member"] in leaves and leaves[d1["member"]] >= d1["t"]:
                    starts.append(leaves[d1["member"]])
                if starts:
                    end = min(end, min(starts))
                if d2["t"] < end - EPS:
                    out.append(
                        Violation(
                            "exclusive_lease",
                            f"message {d2['tag']} (p{d2['partition']} seg {d2['seq']}/{d2['idx']}) delivered to "
                            f"{d2['member']} at t={d2['t']:.3f} while {d1['member']} held a live lease until "
                            f"t={expiry:.3f} (unsettled)",
                            [d1, d2],
                        )
                    )
    return out


def no_delivery_after_ack(ix: Index) -> list[Violation]:
    """Nothing is handed out after an OK ack.

    Once an ack (or a dead-letter nack) of a message returned OK to the app, no member of that
    group may receive the same message (group, position, tag) again, unless the acked lease
    began before an operator's seek back (``earliest``) may have landed: a seek replays every
    message from its position, those in flight at the seek included (a lease kept across the seek
    is acked without marking the message done when its segment is not in the new window yet).
    """
    acked: dict[MsgKey, tuple[Event, Event]] = {}
    for op in ("ack", "nack"):
        for call, ret in ix.by_op.get(op, []):
            if ret is None or ret["outcome"] != "ok" or (op == "nack" and call.get("requeue", True)):
                continue
            k = msg_key(call)
            if k not in acked or ret["t"] < acked[k][1]["t"]:
                acked[k] = (call, ret)
    # when each delivered lease began, on the checker's clock (a prefetched message is claimed
    # before it is handed out; ``leased_at`` is the holder's wall clock, as ``until`` is)
    leased_at = {
        d["receipt"]: d.get("leased_at", ix.epoch0 + d["t"] + d["skew"]) - ix.epoch0 - d["skew"]
        for d in ix.deliveries
    }
    holder = {d["receipt"]: d for d in ix.deliveries}
    out = []
    for d in ix.deliveries:
        hit = acked.get(msg_key(d))
        if hit is not None and hit[0]["receipt"] in holder and ix.beyond_margin(holder[hit[0]["receipt"]], d):
            continue  # the acked lease and this one: clocks apart beyond the margin (I15)
        if hit is not None and any(
            target == "earliest"
            and called < d["t"]
            and landed >= leased_at.get(hit[0]["receipt"], hit[1]["t"]) - EPS
            for called, landed, target in ix.seeks(d["group"], d["topic"])
        ):
            continue  # delivered before a seek back: the seek replays it (at least once)
        if hit is not None and d["t"] > hit[1]["t"] + EPS:
            out.append(
                Violation(
                    "no_delivery_after_ack",
                    f"message {d['tag']} delivered to {d['member']} at t={d['t']:.3f} after its "
                    f"{hit[0]['op']} returned OK at t={hit[1]['t']:.3f}",
                    [hit[0], hit[1], d],
                )
            )
    return out


def replicas_converge(ix: Index) -> list[Violation]:
    """Every replica converges with a fresh ``load()`` of its cursor log.

    At the end (no writer left), each live member's in-memory cursor state, caught up with the
    log, equals the state a new reader loads from the bucket (a reader of the topic's current
    incarnation; a member still on an earlier incarnation of a re-created topic, which it has not
    noticed yet, holds a replica of another log and is not compared).
    """
    fresh = {(e["topic"], e["group"], e["partition"]): e for e in ix.events if e["ev"] == "fresh"}
    out = []
    for e in ix.events:
        if e["ev"] != "replica":
            continue
        f = fresh.get((e["topic"], e["group"], e["partition"]))
        if f is None or f["state"] == e["state"]:
            continue
        if e.get("incarnation") and f.get("incarnation") and e["incarnation"] != f["incarnation"]:
            continue  # the member has not yet noticed its topic's re-creation: another log
        out.append(
            Violation(
                "replicas_converge",
                f"member {e['member']}'s replica of {e['topic']}/{e['group']}/p{e['partition']} "
                f"({_state_summary(e['state'])}) differs from a fresh load ({_state_summary(f['state'])})",
                [e, f],
            )
        )
    return out


def _state_summary(state: dict[str, Any]) -> str:
    if not isinstance(state, dict):
        return str(state)[:100]
    return (
        f"n={state.get('n')} floor={state.get('floor')} frontier={state.get('frontier')} "
        f"leases={len(state.get('leases', []))}"
    )


def engine_alive(ix: Index) -> list[Violation]:
    """No engine loop dies and every app call returns.

    No consumer background loop ends with an exception (``loop_died``); no app call raises an
    exception outside the engine's documented errors (``bug``) or leaves the app unable to go on
    (``proc_error``); no app call takes longer than the hang limit, not counting time its process
    was paused (a call with no return counts until the end of the history, unless its process
    crashed meanwhile).
    """
    limit = float(ix.params.get("hang_limit_s", DEFAULT_HANG_LIMIT_S))
    out = []
    for e in ix.events:
        if e["ev"] == "loop_died":
            out.append(
                Violation(
                    "engine_alive", f"consumer loop of {e['member']} died: {e['error']}: {e['msg']}", [e]
                )
            )
        elif e["ev"] == "proc_error":
            out.append(Violation("engine_alive", f"{e['proc']} failed: {e['error']}: {e['msg']}", [e]))
    for cid, call in ix.calls.items():
        ret = ix.rets.get(cid)
        if ret is not None and ret["outcome"] == "bug":
            out.append(
                Violation("engine_alive", f"{call['op']} raised {ret['error']}: {ret['msg']}", [call, ret])
            )
            continue
        if ret is not None and ret["outcome"] == "crashed":
            continue
        end = ret["t"] if ret is not None else ix.end
        if ret is None and any(t >= call["t"] for t in ix.crashes.get(call["proc"], [])):
            continue
        waited = end - call["t"] - ix.paused(call["proc"], call["t"], end)
        if waited > limit:
            out.append(
                Violation(
                    "engine_alive",
                    f"{call['op']} by {call['proc']} {'returned' if ret else 'still open'} after {waited:.0f}s "
                    f"(limit {limit:.0f}s, paused time excluded)",
                    [call] + ([ret] if ret else []),
                )
            )
    return out


def per_key_order(ix: Index) -> list[Violation]:
    """Per-key order for ordered consumers.

    For a group consuming with ``ordered``, a message of key K at position p is delivered only
    after every earlier position of K in the same partition that the group must see (delivered to
    it at some point, or published after it subscribed) was settled for good: an ack or
    dead-letter that may have been applied started before, or it reached the topic's
    max_deliveries and its last lease had expired (the janitor's dead-letter). Topics that were
    deleted during the history are skipped (positions are reused).
    """
    ordered = ix.ordered_groups()
    if not ordered:
        return []
    limits = {
        t["name"]: int(t.get("max_deliveries", DEFAULT_MAX_DELIVERIES)) for t in ix.params.get("topics", [])
    }
    # the key of each known position, from acknowledged publishes and from deliveries
    keys: dict[tuple[str, int], dict[tuple[int, int], str]] = defaultdict(dict)
    covered: dict[tuple[str, int, int, int], float] = {}
    for call, ret in ix.publishes():
        if (
            ret is not None
            and ret["outcome"] == "ok"
            and call.get("key") is not None
            and not ret.get("duplicate")
        ):
            keys[(call["topic"], ret["partition"])][(ret["seq"], ret["index"])] = call["key"]
            covered[(call["topic"], ret["partition"], ret["seq"], ret["index"])] = call["t"]
    for d in ix.deliveries:
        if d.get("key") is not None:
            keys[(d["topic"], d["partition"])][(d["seq"], d["idx"])] = d["key"]
    settle = _settlements(ix)
    settled_at: dict[tuple[str, str, int, int, int], float] = {}
    delivered_to: set[tuple[str, str, int, int, int]] = set()
    for d in ix.deliveries:
        pos = (d["group"], d["topic"], d["partition"], d["seq"], d["idx"])
        delivered_to.add(pos)
        times = [
            c["t"]
            for c, r in settle.get(d["receipt"], [])
            if c["op"] == "ack" or not c.get("requeue", True)
            if _maybe_applied(r)
        ]
        if int(d.get("deliveries", 0)) >= limits.get(d["topic"], DEFAULT_MAX_DELIVERIES):
            times.append(ix.lease_end(d))
        if times:
            settled_at[pos] = min(settled_at.get(pos, min(times)), min(times))
    out = []
    for d in ix.deliveries:
        group, topic = d["group"], d["topic"]
        if (group, topic) not in ordered or d.get("key") is None or ix.has_deletes(topic):
            continue
        since = min((t for (g, tp, _e), t in ix.subs.items() if g == group and tp == topic), default=None)
        here = (d["seq"], d["idx"])
        for q, key in keys[(topic, d["partition"])].items():
            if key != d["key"] or q >= here:
                continue
            qpos = (group, topic, d["partition"], q[0], q[1])
            published = covered.get((topic, d["partition"], q[0], q[1]))
            relevant = qpos in delivered_to or (
                published is not None and since is not None and published >= since
            )
            if not relevant:
                continue
            done = settled_at.get(qpos)
            if done is None or done > d["t"] + EPS:
                out.append(
                    Violation(
                        "per_key_order",
                        f"ordered group {group}: key {key!r} at seg {here[0]}/{here[1]} delivered at t={d['t']:.3f} "
                        f"before the earlier seg {q[0]}/{q[1]} of the same key was settled"
                        + (f" (settled at t={done:.3f})" if done is not None else " (never settled)"),
                        [d],
                    )
                )
                break
    return out


def dedup_stored_once(ix: Index) -> list[Violation]:
    """An idempotent publish (same dedup_id) is stored once.

    All evidence of where a dedup id's message lives (acknowledged publishes, including those
    answered as duplicates, deliveries, and the segments found in the bucket at the end at or
    above their floor fence) names a single position. Topics deleted during the history are
    skipped (deletion drops markers).

    A dead-letter copy keeps its record's dedup id, and each group dead-letters on its own (the
    engine guards each copy with the id ``dlq/{topic}/{group}/{partition}/{position}``): two
    groups that both give up on a message leave one copy each, so copies count per group.
    """

    def deleted(topic: str) -> bool:  # a dead-letter topic inherits its source's deletions
        return ix.has_deletes(topic) or (topic.endswith(".dlq") and ix.has_deletes(topic[: -len(".dlq")]))

    dedup_of: dict[str, tuple[str, str]] = {}
    positions: dict[tuple[str, str], dict[tuple[int, int, int], Event]] = defaultdict(dict)
    for call, ret in ix.publishes():
        if call.get("dedup_id") is None or deleted(call["topic"]):
            continue
        dedup_of[call["tag"]] = (call["topic"], call["dedup_id"])
        if ret is not None and ret["outcome"] == "ok":
            positions[(call["topic"], call["dedup_id"])].setdefault(
                (ret["partition"], ret["seq"], ret["index"]), ret
            )
    for d in ix.deliveries:
        k = dedup_of.get(d["tag"])
        if k is not None and k[0] == d["topic"]:
            positions[k].setdefault((d["partition"], d["seq"], d["idx"]), d)
    for e in ix.events:
        if e["ev"] != "stored" or deleted(e["topic"]) or e.get("orphan"):
            continue  # an orphan below the floor fence is read by nobody and collected (I1)
        groups = e.get("dlq_for") or [None] * len(e["dedups"])
        for idx, (dedup, group) in enumerate(zip(e["dedups"], groups, strict=False)):
            if dedup is not None:  # includes the engine's own (dead-letter copies, per group)
                scoped = dedup if group is None else f"{dedup} (dead letter for {group})"
                positions[(e["topic"], scoped)].setdefault((e["partition"], e["seq"], idx), e)
    out = []
    for (topic, dedup), where in positions.items():
        if len(where) > 1:
            out.append(
                Violation(
                    "dedup_stored_once",
                    f"dedup id {dedup!r} on {topic} is stored at {len(where)} positions: {sorted(where)}",
                    list(where.values())[:6],
                )
            )
    return out


def no_publish_into_deleted_topic(ix: Index) -> list[Violation]:
    """A publish into a topic that does not exist is never acknowledged.

    A publish that started after a deletion of its topic had finished, and returned OK before the
    topic was created again, was acknowledged for a message no subscription can ever receive.
    """
    out = []
    for call, ret in ix.publishes():
        if ret is not None and ret["outcome"] == "ok" and ix.in_gap(call["topic"], call["t"], ret["t"]):
            out.append(
                Violation(
                    "no_publish_into_deleted_topic",
                    f"publish {call['tag']} into deleted topic {call['topic']} was acknowledged",
                    [call, ret],
                )
            )
    return out


def one_position_per_message(ix: Index) -> list[Violation]:
    """A message one publish call stored lives at one position: its acknowledged (partition, seq,
    index) and every delivery of it name the same one. Two positions mean the call stored it twice
    (r12: a producer held up after its segment landed took that segment, read and fenced meanwhile,
    for an orphan and wrote it again). Tags published by several calls (idempotent retries) are
    ``dedup_stored_once``'s, job messages ``job_one_copy``'s."""
    calls: dict[tuple[str, str], list[tuple[Event, Event | None]]] = defaultdict(list)
    for call, ret in ix.publishes():
        calls[(call["topic"], call["tag"])].append((call, ret))
    jobs = ix.job_of()
    single = {key: pairs[0] for key, pairs in calls.items() if len(pairs) == 1 and key not in jobs}
    where: dict[tuple[str, str], dict[tuple[int, int, int], Event]] = defaultdict(dict)
    for key, (_, ret) in single.items():
        if ret is not None and ret["outcome"] == "ok":
            where[key].setdefault((int(ret["partition"]), int(ret["seq"]), int(ret["index"])), ret)
    for d in ix.deliveries:
        key = (d["topic"], d["tag"])
        if key in single:
            where[key].setdefault((int(d["partition"]), int(d["seq"]), int(d["idx"])), d)
    return [
        Violation(
            "one_position_per_message",
            f"message {tag} on {topic} is at {len(positions)} positions: {sorted(positions)}",
            list(positions.values())[:6],
        )
        for (topic, tag), positions in where.items()
        if len(positions) > 1
    ]


def no_phantom_delivery(ix: Index) -> list[Violation]:
    """Only published messages are delivered: every delivered tag was published to that topic (or
    is a message of a job run on that topic)."""
    published = {(c["topic"], c["tag"]) for c, _ in ix.publishes()} | set(ix.job_of())
    return [
        Violation("no_phantom_delivery", f"delivered {d['tag']!r} on {d['topic']} was never published", [d])
        for d in ix.deliveries
        if (d["topic"], d["tag"]) not in published
    ]


def undelivered_jobs(ix: Index) -> list[tuple[str, Job, str]]:
    """(group, job, why) for every committed job a group still has to receive all of: a covering
    subscription (``committed``), or one subscribed when the job committed that received part of
    it (``partial``); the runner's quiesce phase waits for this to be empty."""
    out = []
    received = ix.received()
    for job in ix.jobs.values():
        if not job.committed:
            continue
        covering = set(ix.covering(job))
        for group in sorted(covering | ix.subscribed_at_commit(job)):
            got = received.get(group, set()) & job.tags
            if got == job.tags:
                continue
            if group in covering:
                out.append((group, job, "committed"))
            elif got:
                out.append((group, job, "partial"))
    return out


def _job_events(job: Job) -> list[Event]:
    return [e for call, ret in job.runs[:3] for e in (call, ret) if e is not None]


def job_all_or_nothing(ix: Index) -> list[Violation]:
    """A job is received by a group whole or not at all.

    A group whose subscription surely existed when the job committed (a join had returned before
    the store applied the commit) and that received (delivered, or dead-lettered for it) any
    message of the job received every message of it by the end of the quiesced run. (A group whose
    first join was still running at the commit may have started some partitions before it and some
    after, as a ``latest`` start is per partition; one created later may find part of the job
    collected by retention.) A job that never committed (no run returned OK and the store's journal
    shows no record of it written ``committed``: every run failed, was aborted or crashed before
    the flip) has none of its messages delivered to anyone.
    """
    out = []
    received = ix.received()
    for job in ix.jobs.values():
        at_commit = ix.subscribed_at_commit(job)
        for group, got in sorted(received.items()):
            part = got & job.tags
            if not part:
                continue
            sample = [d for d in ix.deliveries if d["group"] == group and d["tag"] in part][:2]
            if not job.committed:
                out.append(
                    Violation(
                        "job_all_or_nothing",
                        f"group {group} received {len(part)} message(s) of job {job.name} on {job.topic}, which never "
                        f"committed ({len(job.runs)} run(s), none OK, no commit in the store)",
                        sample + _job_events(job),
                    )
                )
            elif part != job.tags and group in at_commit:
                missing = sorted(job.tags - part)
                out.append(
                    Violation(
                        "job_all_or_nothing",
                        f"group {group} received {len(part)} of the {len(job.tags)} messages of job {job.name} on "
                        f"{job.topic}; never: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}",
                        sample + _job_events(job),
                    )
                )
    return out


def job_one_copy(ix: Index) -> list[Violation]:
    """One copy of each message of a job.

    No group receives a message of a job from two positions (partition, seq, index) or under two
    message ids: whatever runs of the job succeeded, failed, were aborted or crashed, one copy of
    it is visible. The store's journal shows at most one record of a job written ``committed``.
    """
    out = []
    job_of = ix.job_of()
    copies: dict[tuple[str, str, str], dict[tuple[Any, ...], Event]] = defaultdict(dict)
    ids: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for d in ix.deliveries:
        if (d["topic"], d["tag"]) not in job_of:
            continue
        k = (d["group"], d["topic"], d["tag"])
        copies[k].setdefault((d["partition"], d["seq"], d["idx"]), d)
        if d.get("id") is not None:
            ids[k].add(d["id"])
    for (group, topic, tag), where in copies.items():
        if len(where) > 1 or len(ids[(group, topic, tag)]) > 1:
            out.append(
                Violation(
                    "job_one_copy",
                    f"message {tag} of job {job_of[(topic, tag)].name} was delivered to group {group} as "
                    f"{max(len(where), len(ids[(group, topic, tag)]))} copies: positions {sorted(where)}",
                    list(where.values())[:4],
                )
            )
    for job in ix.jobs.values():
        if len(job.commits) > 1:
            out.append(
                Violation(
                    "job_one_copy",
                    f"job {job.name} on {job.topic} committed {len(job.commits)} times: "
                    f"{', '.join(e['id'] for e in job.commits)}",
                    job.commits[:4],
                )
            )
    return out


def job_committed_delivered(ix: Index) -> list[Violation]:
    """A committed job is delivered, like an acknowledged publish.

    A job that committed (a run returned OK, or the store's journal shows its record written
    ``committed``) has every message received by every group whose subscription covers it: a join
    of the group had returned before the job's first run began, in a topic incarnation that lives
    to the end.
    """
    return [
        Violation(
            "job_committed_delivered",
            f"job {job.name} on {job.topic} committed{' (acknowledged)' if job.acked else ''}, but group "
            f"{group} received {len(ix.received().get(group, set()) & job.tags)} of its {len(job.tags)} messages",
            _job_events(job) + job.commits[:1],
        )
        for group, job, why in undelivered_jobs(ix)
        if why == "committed"
    ]


def job_no_pending_delivery(ix: Index) -> list[Violation]:
    """Readers never deliver a message of a transaction that is not committed.

    Every delivered message of a job comes from a segment that a record of that job names as one of
    its chunks, at that very seq, in a write of the record as ``committed`` that the store applied
    before the delivery (its journal event comes first). A delivery from a pending or aborted
    transaction, from a duplicate copy of a chunk, or before the commit is a violation. Histories
    without a store journal (no ``txn`` events) are not checked.
    """
    if not ix.txns:
        return []
    job_of = ix.job_of()
    shown: dict[tuple[str, str, int, int], Event] = {}  # (topic, job, partition, seq) -> first commit
    for e in ix.txns:
        if e["state"] != "committed":
            continue
        for p, seqs in e.get("partitions", {}).items():
            for seq in seqs:
                if seq is not None:
                    shown.setdefault((e["topic"], e.get("job", ""), int(p), int(seq)), e)
    out = []
    for d in ix.deliveries:
        job = job_of.get((d["topic"], d["tag"]))
        if job is None:
            continue
        commit = shown.get((d["topic"], job.name, int(d["partition"]), int(d["seq"])))
        if commit is None:
            out.append(
                Violation(
                    "job_no_pending_delivery",
                    f"message {d['tag']} of job {job.name} delivered to {d['member']} at t={d['t']:.3f} from "
                    f"p{d['partition']} seg {d['seq']}, which no committed record of the job shows",
                    [d, *[e for e in ix.txns if e.get("job") == job.name][:5]],
                )
            )
        elif commit["i"] > d["i"]:
            out.append(
                Violation(
                    "job_no_pending_delivery",
                    f"message {d['tag']} of job {job.name} delivered at t={d['t']:.3f}, before its transaction "
                    f"{commit['id']} committed (t={commit['t']:.3f})",
                    [d, commit],
                )
            )
    return out


def job_chunks_kept(ix: Index) -> list[Violation]:
    """A committed job's chunk is deleted only after the reference segment that names it.

    For every chunk a record written ``committed`` names (at any point of the history) under a
    reference segment at (partition, seq): a deletion of the chunk comes after a deletion of that
    segment. A chunk deleted earlier (while its job ran, committed, or was read) loses messages a
    committed job promised.
    """
    owner: dict[tuple[str, str], list[tuple[int, int, Event]]] = defaultdict(list)
    for e in ix.txns:
        if e["state"] != "committed":
            continue
        for p, entries in (e.get("refs") or {}).items():
            seqs = e.get("partitions", {}).get(p, [])
            for seq, names in zip(seqs, entries, strict=False):
                for name in names:
                    if seq is not None:
                        owner[(e["topic"], name)].append((int(p), int(seq), e))
    gone: dict[tuple[str, int, int], int] = {}
    out = []
    for d in ix.deletes:
        if "seq" in d:
            gone.setdefault((d["topic"], int(d["partition"]), int(d["seq"])), d["i"])
            continue
        for p, seq, commit in owner.get((d["topic"], d["chunk"]), []):
            if gone.get((d["topic"], p, seq), d["i"] + 1) > d["i"]:
                out.append(
                    Violation(
                        "job_chunks_kept",
                        f"chunk {d['chunk']} of committed job {commit.get('job')} was deleted at t={d['t']:.3f} "
                        f"while its reference segment p{p}/{seq} was stored",
                        [d, commit],
                    )
                )
    return out


# Offsets the clock check must report: beyond the margin by more than the store's whole-second
# resolution and a round trip can explain. Within half the margin it must stay quiet.
CLOCK_CLEAR_S = 1.5


def clock_reported(ix: Index) -> list[Violation]:
    """A process whose clock is off the store's beyond the margin says so; one within it does not.

    Every process compares its clock with the store's when it opens the bucket (``clock`` events:
    its offset and whether it warned), and GC at every collection (``clock_warning`` in its
    return). An offset beyond ``clock_skew_s`` plus CLOCK_CLEAR_S must have warned; one within half
    the margin must not have (no false alarm). Ages that decide deletions do not depend on it
    (I15, checked by ``acked_publish_delivered``): what does is lease exclusivity between members,
    which the other checks excuse only between clocks apart beyond the margin, all reported here.
    """
    out = []
    offsets = {proc: float(e["offset"]) for proc, e in ix.clocks.items()}

    def judge(proc: str, offset: float, warned: object, where: list[Event]) -> None:
        if abs(offset) > ix.margin + CLOCK_CLEAR_S and warned is not True:
            out.append(
                Violation(
                    "clock_reported",
                    f"{proc}'s clock is {offset:+.1f}s off the store's (margin {ix.margin:g}s) and it "
                    + ("was never compared" if warned is None else "did not warn"),
                    where,
                )
            )
        elif abs(offset) <= ix.margin / 2 + EPS and warned is True:
            out.append(
                Violation(
                    "clock_reported",
                    f"{proc}'s clock is within the margin ({offset:+.2f}s) but it warned",
                    where,
                )
            )

    for proc, e in ix.clocks.items():
        judge(proc, offsets[proc], e.get("warned"), [e])
    for call, ret in ix.by_op.get("gc", []):
        if ret is not None and ret["outcome"] == "ok" and call["proc"] in offsets:
            judge(call["proc"], offsets[call["proc"]], ret.get("clock_warning"), [call, ret])
    return out


def foreign_objects_kept(ix: Index) -> list[Violation]:
    """Nothing deletes what bucketq never wrote (I8): every foreign object the vandal dropped is
    still in the bucket at the end, unless its topic was deleted (a deletion purges the topic's
    whole prefix, as asked)."""
    deleted = {t for t in ix.lifecycle if ix.has_deletes(t)}

    def topic_of(key: str) -> str:  # a topic's own prefix, or its member heartbeats' prefix
        parts = key.split("/")
        return parts[2] if key.startswith("_registry/members/") and len(parts) > 2 else parts[0]

    return [
        Violation("foreign_objects_kept", f"{e['key']}, which bucketq never wrote, was deleted", [e])
        for e in ix.events
        if e["ev"] == "foreign" and not e["kept"] and topic_of(e["key"]) not in deleted
    ]


# The "few seconds" of I16 beyond the margins: a cycle, a write, the app's next poll.
LEASE_SLACK_S = 5.0


def lease_redelivered(ix: Index) -> list[Violation]:
    """An expired lease is redelivered within the visibility timeout plus a few seconds (I16).

    A delivery whose lease ends by expiry (no settlement that may have been applied started before
    it, its holder did not leave) at ``E`` (the app's deadline, or a later successful extend, in the
    holder's clock corrected by its skew) is delivered again, to any member of the group, by
    ``E + 2 × clock_skew_s + steal_after_s + LEASE_SLACK_S`` — provided a **witness** could do
    it: the holder itself, or a member that joined after the delivery (its join read the lease);
    alive, not stopped, not cut off from the store, its app not paused and its clock within the
    margin over the whole window (from ``E``, or from the witness's join if later). Only where
    nothing else may legitimately hold it up: leases that run out after the quiesce phase began (no
    new faults, members drain), or anywhere in schedules that promise room and no faults
    (``lease_liveness``); not for ordered groups (an earlier key may block it), dead-letter limits,
    seeks, or topic deletions in between.
    """
    params, consumer = ix.params, ix.params.get("consumer", {})
    bound = 2 * ix.margin + float(consumer.get("steal_after_s", 2.0)) + LEASE_SLACK_S
    everywhere = bool(params.get("lease_liveness"))
    if not everywhere and ix.quiesce_t is None:
        return []
    limits = {
        t["name"]: int(t.get("max_deliveries", DEFAULT_MAX_DELIVERIES)) for t in params.get("topics", [])
    }
    ordered = ix.ordered_groups()
    settle = _settlements(ix)
    extends: dict[str, float] = {}
    for call, ret in ix.by_op.get("extend", []):
        if ret is not None and ret["outcome"] == "ok" and "until" in ret:
            extends[call["receipt"]] = max(extends.get(call["receipt"], 0.0), float(ret["until"]))
    left = {c["member"]: c["t"] for c, _ in ix.by_op.get("leave", []) if c.get("member")}
    joins = [(c, r) for c, r in ix.by_op.get("join", []) if r is not None and r["outcome"] == "ok"]
    by_msg: dict[MsgKey, list[Event]] = defaultdict(list)
    for d in ix.deliveries:
        by_msg[msg_key(d)].append(d)
    dead_lettered = {(g, t) for g, tags in ix.received().items() for t in tags} - {
        (d["group"], d["tag"]) for d in ix.deliveries
    }

    def able(proc: str, member: str | None, start: float, end: float) -> bool:
        offset = float(ix.clocks.get(proc, {}).get("offset", 0.0))
        return (
            not any(t <= end for t in ix.crashes.get(proc, []))
            and ix.paused(proc, start, end) == 0.0
            and not any(a < end and b > start for a, b in ix.outages.get(proc, []))
            and not any(a < end and b > start for a, b in ix.app_pauses.get(proc, []))
            and abs(offset) <= ix.margin / 2 + EPS
            and (member is None or left.get(member, float("inf")) > end)
        )

    out = []
    for key, ds in by_msg.items():
        group, topic = key[0], key[1]
        if (group, topic) in ordered or ix.has_deletes(topic) or ix.seeks(group, topic):
            continue
        ds.sort(key=lambda e: (e["t"], e["i"]))
        for j, d in enumerate(ds):
            if int(d.get("deliveries", 1)) >= limits.get(topic, DEFAULT_MAX_DELIVERIES):
                continue  # the janitor dead-letters it instead
            expiry = ix.lease_end(d, extends.get(d["receipt"], 0.0))
            if any(c["t"] < expiry and _maybe_applied(r) for c, r in settle.get(d["receipt"], [])):
                continue  # settled (or released) before it ran out
            if left.get(d["member"], float("inf")) <= expiry or (group, d["tag"]) in dead_lettered:
                continue  # released at close; or settled as a dead letter
            if not everywhere and expiry < (ix.quiesce_t or float("inf")):
                continue
            starts = []
            if able(d["proc"], d["member"], expiry, expiry + bound):
                starts.append(expiry)
            for c, r in joins:
                if c["group"] == group and c["topic"] == topic and c["t"] > d["t"]:
                    begin = max(expiry, r["t"])
                    if able(c["proc"], r.get("member"), begin, begin + bound):
                        starts.append(begin)
            if not starts:
                continue
            deadline = min(starts) + bound
            if deadline > ix.end:
                continue  # the run ended first
            if any(expiry - EPS <= d2["t"] <= deadline for d2 in ds[j + 1 :]):
                continue  # delivered again in time
            if any(
                c["t"] <= deadline and r is not None and r["outcome"] == "ok"
                for rc in {e["receipt"] for e in ds}
                for c, r in settle.get(rc, [])
            ):
                continue  # settled for good (an ack after the deadline but before a reclaim is valid)
            late = next((d2["t"] for d2 in ds[j + 1 :] if d2["t"] >= expiry - EPS), None)
            out.append(
                Violation(
                    "lease_redelivered",
                    f"message {d['tag']} (p{d['partition']} seg {d['seq']}/{d['idx']}) of group {group}: the "
                    f"lease {d['member']} held ran out at t={expiry:.3f} and was redelivered "
                    + (f"at t={late:.3f}" if late is not None else "never")
                    + f" (bound t={deadline:.3f})",
                    [d, *[d2 for d2 in ds[j + 1 :] if d2["t"] >= expiry - EPS][:1]],
                )
            )
    return out


def settlement_honoured(ix: Index) -> list[Violation]:
    """A holder's settlement answered while its lease lives is never refused (I4, I20).

    The app holds a delivered message until its lease's deadline (``until``, or a later successful
    extend), whether the member claimed it with a write or handed it out under a standing claim
    before the segment's ``seen`` was written. An ack, nack or dead-letter it asks for and is
    answered about before that deadline (less the clock margin) is a settlement of a live lease:
    answered "lease lost", the message comes back although the app settled it (a push app's DROP
    was refused this way under standing claims, and delivered again). Checked where nothing else
    can end a lease early: no seek of the group, no deletion of the topic, the holder not leaving
    and the group's clocks within the margin; only in schedules that promise room and no faults
    (``lease_liveness``) or once the quiesce phase began.
    """
    everywhere = bool(ix.params.get("lease_liveness"))
    if not everywhere and ix.quiesce_t is None:
        return []
    extends: dict[str, float] = {}
    for call, ret in ix.by_op.get("extend", []):
        if ret is not None and ret["outcome"] == "ok" and "until" in ret:
            extends[call["receipt"]] = max(extends.get(call["receipt"], 0.0), float(ret["until"]))
    delivered = {d["receipt"]: d for d in ix.deliveries}
    left = {c["member"]: c["t"] for c, _ in ix.by_op.get("leave", []) if c.get("member")}
    out = []
    for receipt, settlements in _settlements(ix).items():
        d = delivered.get(receipt)
        if d is None or ix.has_deletes(d["topic"]) or ix.seeks(d["group"], d["topic"]):
            continue
        offset = float(ix.clocks.get(d["proc"], {}).get("offset", 0.0))
        if abs(offset) > ix.margin / 2 + EPS or ix.spread.get(d["group"], 0.0) > ix.margin + EPS:
            continue  # a member's clock far ahead may take a live lease (I10)
        expiry = ix.lease_end(d, extends.get(receipt, 0.0)) - ix.margin
        for call, ret in settlements:
            if ret is None or _maybe_applied(ret) or ret["t"] >= expiry:
                continue
            if left.get(d["member"], float("inf")) <= ret["t"]:
                continue
            if not everywhere and call["t"] < (ix.quiesce_t or float("inf")):
                continue
            out.append(
                Violation(
                    "settlement_honoured",
                    f"{call['op']} of message {d['tag']} (p{d['partition']} seg {d['seq']}/{d['idx']}) by "
                    f"{d['member']} was refused as a lost lease at t={ret['t']:.3f}, its lease living "
                    f"until t={expiry + ix.margin:.3f}",
                    [d, call, ret],
                )
            )
    return out


INVARIANTS: dict[str, Callable[[Index], list[Violation]]] = {
    "acked_publish_delivered": acked_publish_delivered,
    "exclusive_lease": exclusive_lease,
    "no_delivery_after_ack": no_delivery_after_ack,
    "replicas_converge": replicas_converge,
    "engine_alive": engine_alive,
    "per_key_order": per_key_order,
    "dedup_stored_once": dedup_stored_once,
    "no_publish_into_deleted_topic": no_publish_into_deleted_topic,
    "no_phantom_delivery": no_phantom_delivery,
    "one_position_per_message": one_position_per_message,
    "job_all_or_nothing": job_all_or_nothing,
    "job_one_copy": job_one_copy,
    "job_committed_delivered": job_committed_delivered,
    "job_no_pending_delivery": job_no_pending_delivery,
    "job_chunks_kept": job_chunks_kept,
    "clock_reported": clock_reported,
    "foreign_objects_kept": foreign_objects_kept,
    "lease_redelivered": lease_redelivered,
    "settlement_honoured": settlement_honoured,
}


def check(events: Iterable[Event], only: Iterable[str] | None = None) -> list[Violation]:
    """Every violation of the invariants (or of ``only`` those named) in the history."""
    ix = Index(list(events))
    names = list(only) if only is not None else list(INVARIANTS)
    out: list[Violation] = []
    for name in names:
        out.extend(INVARIANTS[name](ix))
    return out
