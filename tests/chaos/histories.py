"""Histories recorded by real processes, made fit for the simulation's checker, and checked.

Each chaos process appends its own JSON-lines file (``worker.Recorder``); the controller appends
crashes, restarts, pauses and phases to its own. :func:`merge` turns those files into one history
in the format of ``tests/sim/history.py``:

* a killed process may leave a **partial last line**: it is dropped (and counted); a line that is
  not the last and does not parse is an error, never skipped (nothing else can produce one);
* ``cid`` is per process: it is renumbered globally, so calls and returns of different processes
  never pair up;
* ``lease`` events (a member's later reading of ``Message.lease_until``: it rises when a prefetch
  extend commits after the message was handed out) raise the ``until`` of that member's delivery of
  the receipt and are then dropped: the checker judges a lease by the latest deadline its holder
  was given;
* events are ordered by ``t`` (seconds since the run's epoch on the one host clock every process
  shares) and numbered ``i``.

:func:`check` runs the simulation's invariants that a real-process history supports, plus:

* ``acked_publish_settled``: every acknowledged publish is, in every group that covers it, done in
  a fresh load of the group's cursor at the end, or still pending there (in the cursor's window,
  or in a stored segment beyond its frontier); anything else was lost. A cursor whose ``expire``
  op skipped messages (``collected``) lost them too.
* ``one_position_per_message``: a message (tag) lives at one position and a position holds one
  message, across acknowledged publishes, deliveries and the segments stored at the end at or
  above the partition's floor fence. Two tags at one position means a segment number was taken
  twice (invariant I1); one tag at two positions means a message was stored twice.
* ``handoff_after_skew_margin``: a message its holder had not settled reaches another member only
  more than ``clock_skew_s`` after the holder's lease ended (I4; exact here: one host clock).
* ``no_persistent_failure`` and ``snapshot_readable``: no bad object or outage makes publishing,
  GC or the engine's statistics fail for good (I8, seen from the application).

Everything here is a pure function of the events, like the simulation's checker.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.sim import checker
from tests.sim.checker import EPS, Index, Violation, msg_key
from tests.sim.history import Event

# The simulation's invariants that a real-process history supports. The first three are what the
# chaos tests exist for and must be there; the others hold vacuously when their events are absent.
REQUIRED = ("acked_publish_delivered", "exclusive_lease", "no_delivery_after_ack")
SUPPORTED = (*REQUIRED, "no_phantom_delivery", "replicas_converge", "engine_alive", "dedup_stored_once")


class HistoryError(ValueError):
    """A history file is damaged beyond what a killed writer can leave."""


# -- reading -----------------------------------------------------------------------------------


def parse_lines(text: str, source: str) -> tuple[list[Event], int]:
    """The events of one process's file and how many partial last lines were dropped (0 or 1).

    Each event is written with one ``write`` of its line and newline, so a kill -9 can only cut
    the last line short. A last line that parses whole (cut just before its newline) is kept.
    """
    lines = text.split("\n")
    tail = lines.pop()  # "" when the file ends with a newline
    events: list[Event] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise HistoryError(f"{source}:{n}: damaged line before the end of the file: {exc}") from None
    partial = 0
    if tail.strip():
        try:
            obj = json.loads(tail)
        except json.JSONDecodeError:
            partial = 1
        else:
            if isinstance(obj, dict):
                events.append(obj)
            else:
                partial = 1
    return events, partial


@dataclass
class Merged:
    """One history built from many processes' files."""

    events: list[Event]
    partial_lines: int
    sources: int


def merge(streams: Iterable[tuple[str, str]]) -> Merged:
    """Merge ``(source name, file text)`` pairs into one checker-ready history (module docstring)."""
    collected: list[tuple[float, int, int, Event]] = []
    partial = 0
    next_cid = 0
    sources = 0
    for s, (source, text) in enumerate(streams):
        sources += 1
        events, dropped = parse_lines(text, source)
        partial += dropped
        cids: dict[Any, int] = {}
        for n, e in enumerate(events):
            if "cid" in e:
                if e["cid"] not in cids:
                    next_cid += 1
                    cids[e["cid"]] = next_cid
                e["cid"] = cids[e["cid"]]
            collected.append((float(e.get("t", 0.0)), s, n, e))
    collected.sort(key=lambda c: c[:3])
    later: dict[tuple[str, str], float] = {}
    for _, _, _, e in collected:
        if e["ev"] == "lease":
            k = (e["proc"], e["receipt"])
            later[k] = max(later.get(k, 0.0), float(e["until"]))
    out: list[Event] = []
    for _, _, _, e in collected:
        if e["ev"] == "lease":
            continue
        if e["ev"] == "deliver":
            seen = later.get((e["proc"], e["receipt"]))
            if seen is not None and seen > float(e["until"]):
                e = {**e, "until": seen, "until_at_delivery": e["until"]}
        out.append({**e, "i": len(out)})
    return Merged(out, partial, sources)


def load_dir(folder: Path) -> Merged:
    """Every ``*.jsonl`` history file in ``folder``, merged."""
    files = sorted(folder.glob("*.jsonl"))
    return merge((f.name, f.read_text(errors="replace")) for f in files)


# -- the final snapshot ------------------------------------------------------------------------


def _done(state: dict[str, Any], seq: int, idx: int) -> bool:
    if seq < int(state["floor"]):
        return True
    seg = state["segments"].get(str(seq))
    return seg is not None and any(lo <= idx <= hi for lo, hi in seg["done"])


def _in_window(state: dict[str, Any], seq: int, idx: int) -> bool:
    seg = state["segments"].get(str(seq))
    return seg is not None and 0 <= idx < int(seg["count"])


class Snapshot:
    """The final snapshot's events: fresh cursor states, floor fences, stored segments."""

    def __init__(self, ix: Index) -> None:
        self.fresh: dict[tuple[str, str, int], dict[str, Any]] = {}
        self.unloadable: dict[tuple[str, str, int], str] = {}
        self.floors: dict[tuple[str, int], int] = {}
        self.stored: dict[tuple[str, int, int], list[Any]] = {}
        for e in ix.events:
            if e["ev"] == "fresh" and isinstance(e["state"], dict) and "floor" in e["state"]:
                self.fresh[(e["topic"], e["group"], int(e["partition"]))] = e["state"]
            elif e["ev"] == "fresh":
                self.unloadable[(e["topic"], e["group"], int(e["partition"]))] = str(e["state"])[:200]
            elif e["ev"] == "fence":
                self.floors[(e["topic"], int(e["partition"]))] = int(e["floor"])
            elif e["ev"] == "stored":
                self.stored[(e["topic"], int(e["partition"]), int(e["seq"]))] = list(e["tags"])

    @property
    def taken(self) -> bool:
        return bool(self.fresh or self.unloadable)

    def live_segments(self) -> dict[tuple[str, int, int], list[Any]]:
        """Stored segments at or above their partition's floor fence (below it: freed numbers and
        orphans a fenced writer left, which nobody reads)."""
        return {k: v for k, v in self.stored.items() if k[2] >= self.floors.get((k[0], k[1]), 0)}


def _covering_groups(ix: Index, topic: str, published_at: float) -> list[str]:
    return sorted({g for (g, t, _epoch), since in ix.subs.items() if t == topic and since <= published_at})


def settlement(ix: Index) -> tuple[list[Violation], list[tuple[str, Event, Event]]]:
    """``acked_publish_settled`` violations, and the (group, call, ret) still pending (undrained)."""
    snap = Snapshot(ix)
    if not snap.taken:
        return [], []
    out: list[Violation] = []
    pending: list[tuple[str, Event, Event]] = []
    for (topic, group, partition), state in sorted(snap.fresh.items()):
        collected = int(state.get("counters", {}).get("collected", 0))
        if collected:
            out.append(
                Violation(
                    "acked_publish_settled",
                    f"group {group} on {topic}/p{partition}: {collected} messages skipped by an expire op "
                    f"(GC freed them before the group read them)",
                    [],
                )
            )
    for call, ret in ix.publishes():
        if ret is None or ret["outcome"] != "ok":
            continue
        topic, partition, seq, idx = call["topic"], int(ret["partition"]), int(ret["seq"]), int(ret["index"])
        for group in _covering_groups(ix, topic, call["t"]):
            found = snap.fresh.get((topic, group, partition))
            if found is None:
                why = snap.unloadable.get((topic, group, partition), "no cursor")
                out.append(
                    Violation(
                        "acked_publish_settled",
                        f"publish {call['tag']} at p{partition}/seg {seq}/{idx}: group {group}'s cursor "
                        f"cannot be loaded at the end: {why}",
                        [call, ret],
                    )
                )
                continue
            state = found
            if _done(state, seq, idx):
                continue
            beyond = seq > int(state["frontier"]) and (topic, partition, seq) in snap.stored
            if _in_window(state, seq, idx) or beyond:
                pending.append((group, call, ret))
                continue
            out.append(
                Violation(
                    "acked_publish_settled",
                    f"publish {call['tag']} acknowledged at p{partition}/seg {seq}/{idx} is lost for group {group}: "
                    f"not done in a fresh load of its cursor (floor {state['floor']}, frontier {state['frontier']}) "
                    f"and not in a stored segment",
                    [call, ret],
                )
            )
    return out, pending


def acked_publish_settled(ix: Index) -> list[Violation]:
    """Every acknowledged publish is done, or still pending, in the final cursor of every group
    covering it (module docstring)."""
    return settlement(ix)[0]


def one_position_per_message(ix: Index) -> list[Violation]:
    """A message lives at one position and a position holds one message (module docstring)."""
    snap = Snapshot(ix)
    where: dict[tuple[str, str], dict[tuple[int, int, int], Event]] = defaultdict(dict)
    holds: dict[tuple[str, int, int, int], dict[str, Event]] = defaultdict(dict)

    def note(topic: str, tag: str, pos: tuple[int, int, int], evidence: Event) -> None:
        where[(topic, tag)].setdefault(pos, evidence)
        holds[(topic, *pos)].setdefault(tag, evidence)

    for call, ret in ix.publishes():
        if ret is not None and ret["outcome"] == "ok":
            note(call["topic"], call["tag"], (int(ret["partition"]), int(ret["seq"]), int(ret["index"])), ret)
    for d in ix.deliveries:
        note(d["topic"], d["tag"], (int(d["partition"]), int(d["seq"]), int(d["idx"])), d)
    for (topic, partition, seq), tags in snap.live_segments().items():
        evidence = {"ev": "stored", "topic": topic, "partition": partition, "seq": seq}
        for idx, tag in enumerate(tags):
            note(topic, str(tag), (partition, seq, idx), evidence)
    out: list[Violation] = []
    for (topic, tag), positions in where.items():
        if len(positions) > 1:
            out.append(
                Violation(
                    "one_position_per_message",
                    f"message {tag} on {topic} is at {len(positions)} positions: {sorted(positions)}",
                    list(positions.values())[:6],
                )
            )
    for (topic, partition, seq, idx), held in holds.items():
        if len(held) > 1:
            out.append(
                Violation(
                    "one_position_per_message",
                    f"{topic}/p{partition} seg {seq}/{idx} holds {len(held)} messages: {sorted(held)} "
                    f"(a segment number taken twice)",
                    list(held.values())[:6],
                )
            )
    return out


def handoff_gaps(ix: Index) -> list[tuple[Event, Event, float]]:
    """(d1, d2, gap) for every delivery d2 of a message to another member than an earlier delivery
    d1's, when d1's holder had not started a settlement that may have applied (nor left) by then:
    ``gap`` is how long after d1's lease ended (its latest deadline, as the checker reads it) d2
    came. Negative: the leases overlapped."""
    starts: dict[str, float] = {}
    for op in ("ack", "nack"):
        for call, ret in ix.by_op.get(op, []):
            if ret is None or ret["outcome"] != "error" or ret.get("error") != "LeaseLost":
                starts[call["receipt"]] = min(starts.get(call["receipt"], call["t"]), call["t"])
    extended: dict[str, float] = {}
    for call, ret in ix.by_op.get("extend", []):
        if ret is not None and ret["outcome"] == "ok" and "until" in ret:
            extended[call["receipt"]] = max(extended.get(call["receipt"], 0.0), float(ret["until"]))
    leaves = {c["member"]: c["t"] for c, _r in ix.by_op.get("leave", []) if c.get("member")}
    by_msg: dict[Any, list[Event]] = defaultdict(list)
    for d in ix.deliveries:
        by_msg[msg_key(d)].append(d)
    out: list[tuple[Event, Event, float]] = []
    for ds in by_msg.values():
        ds.sort(key=lambda e: (e["t"], e["i"]))
        for j, d2 in enumerate(ds):
            for d1 in ds[:j]:
                if d1["member"] == d2["member"]:
                    continue
                if (
                    starts.get(d1["receipt"], float("inf")) <= d2["t"]
                    or leaves.get(d1["member"], float("inf")) <= d2["t"]
                ):
                    continue
                out.append((d1, d2, d2["t"] - ix.lease_end(d1, extended.get(d1["receipt"], 0.0))))
    return out


def handoff_after_skew_margin(ix: Index) -> list[Violation]:
    """I4: a member claims another member's expired lease only when ``until + clock_skew_s < now``.

    Every process of a chaos run reads the same host clock, so this is checkable exactly: a message
    its holder had not settled reaches another member only more than the configured
    ``clock_skew_s`` (the run's ``params``) after the holder's lease ended. Recording can only make
    the gap look larger (a delivery is recorded after ``poll`` returned; a deadline is the holder's
    latest known one), never smaller, so a shorter gap is the engine's.
    """
    margin = float(ix.params.get("clock_skew_s", 0.0))
    return [
        Violation(
            "handoff_after_skew_margin",
            f"message {d2['tag']} (p{d2['partition']} seg {d2['seq']}/{d2['idx']}) reached {d2['member']} "
            f"{gap:.3f}s after {d1['member']}'s unsettled lease ended (margin {margin}s)",
            [d1, d2],
        )
        for d1, d2, gap in handoff_gaps(ix)
        if gap < margin - EPS
    ]


# How many failures in a row of one operation in one process mean the engine does not recover.
# Chaos alone never made more than one publish or collection in a row fail (kills leave calls
# without a return, pauses only delay them): a streak is a stuck process.
STREAKS = {"publish": 5, "gc": 3}


def no_persistent_failure(ix: Index) -> list[Violation]:
    """I8, from the application's side: no bad object or outage makes an operation fail for good.

    In one process, ``STREAKS[op]`` consecutive returned calls of ``op`` that all failed (with a
    documented error or not) is a loop the engine cannot leave: a producer that can no longer
    publish, a GC that can no longer collect. (A consumer's loop that dies is ``engine_alive``'s.)
    """
    by_proc: dict[tuple[str, str], list[tuple[Event, Event]]] = defaultdict(list)
    for op in STREAKS:
        for call, ret in ix.by_op.get(op, []):
            if ret is not None and ret["outcome"] in ("ok", "error", "bug"):
                by_proc[(call["proc"], op)].append((call, ret))
    out: list[Violation] = []
    for (proc, op), pairs in sorted(by_proc.items()):
        pairs.sort(key=lambda p: p[0]["t"])
        limit = STREAKS[op]
        runs: list[list[tuple[Event, Event]]] = [[]]  # consecutive failures, split at each success
        for call, ret in pairs:
            if ret["outcome"] == "ok":
                runs.append([])
            else:
                runs[-1].append((call, ret))
        for n, run in enumerate(runs):
            if len(run) < limit:
                continue
            (first_call, first_ret), (_, last) = run[0], run[-1]
            out.append(
                Violation(
                    "no_persistent_failure",
                    f"{proc}: {len(run)} {op} calls in a row failed from t={first_call['t']:.1f} to t={last['t']:.1f}"
                    f"{' (until the process ended)' if n == len(runs) - 1 else ''}: {last.get('error')}: "
                    f"{last.get('msg', '')}",
                    [first_call, first_ret, last],
                )
            )
    return out


def snapshot_readable(ix: Index) -> list[Violation]:
    """I8 for readers that are not consumers: the engine's own statistics work on what the run
    left in the bucket (a failure here is what an operator's dashboard would show)."""
    return [
        Violation("snapshot_readable", f"stats() failed on the final bucket: {e['error']}: {e['msg']}", [e])
        for e in ix.events
        if e["ev"] == "stats_failed"
    ]


CHAOS_INVARIANTS = {
    "acked_publish_settled": acked_publish_settled,
    "one_position_per_message": one_position_per_message,
    "handoff_after_skew_margin": handoff_after_skew_margin,
    "no_persistent_failure": no_persistent_failure,
    "snapshot_readable": snapshot_readable,
}


def check(events: list[Event]) -> list[Violation]:
    """Every violation in a real-process history: the simulation's supported invariants, then ours."""
    missing = [name for name in REQUIRED if name not in checker.INVARIANTS]
    if missing:
        raise RuntimeError(f"the simulation's checker no longer has {missing}")
    out = checker.check(events, only=[n for n in SUPPORTED if n in checker.INVARIANTS])
    ix = Index(events)
    for fn in CHAOS_INVARIANTS.values():
        out.extend(fn(ix))
    return out


# -- during the run: is the queue drained? -----------------------------------------------------


def outstanding(events: list[Event]) -> tuple[int, int]:
    """(messages some group has not acked OK yet, settlements still open), from the histories.

    A message counts when it is an acknowledged publish covered by the group, or when it was
    delivered to the group at all (a publish whose process was killed before it returned may
    have landed). The quiesce phase is over when both are 0; an ack whose process was killed
    before it returned may have landed too, which only the bucket can tell (the probe).
    """
    ix = Index(events)
    acked = {
        (c["group"], c["tag"]) for c, r in ix.by_op.get("ack", []) if r is not None and r["outcome"] == "ok"
    }
    wanted = {(d["group"], d["tag"]) for d in ix.deliveries}
    for call, ret in ix.publishes():
        if ret is not None and ret["outcome"] == "ok":
            wanted.update((g, call["tag"]) for g in _covering_groups(ix, call["topic"], call["t"]))
    crashed = ix.crashes
    open_calls = 0
    for op in ("ack", "nack", "extend"):
        for call, ret in ix.by_op.get(op, []):
            if ret is None and not any(t >= call["t"] for t in crashed.get(call["proc"], [])):
                open_calls += 1
    return len(wanted - acked), open_calls


# -- numbers for the report --------------------------------------------------------------------


def summarize(events: list[Event]) -> dict[str, Any]:
    """What a run did: messages, settlements, chaos actions, GC work, and the tightest hand-off."""
    ix = Index(events)
    n: dict[str, Any] = defaultdict(int)
    quiesce = next(
        (e["t"] for e in events if e["ev"] == "phase" and e.get("name") == "quiesce"), float("inf")
    )
    for op, pairs in ix.by_op.items():
        for _call, ret in pairs:
            n[f"{op}_calls"] += 1
            if ret is None:
                n[f"{op}_open"] += 1
            elif ret["outcome"] == "ok":
                n[f"{op}_ok"] += 1
            else:
                n[f"{op}_{ret.get('error') or ret['outcome']}"] += 1
            if op == "gc" and ret is not None and ret["outcome"] == "ok":
                for k in ("segments", "deltas", "checkpoints", "fences_raised", "total"):
                    n[f"gc_freed_{k}" if k != "fences_raised" else "gc_fences_raised"] += int(ret.get(k, 0))
                if ret["t"] < quiesce:  # while the traffic and the chaos went on
                    n["gc_freed_segments_during_chaos"] += int(ret.get("segments", 0))
                    n["gc_freed_deltas_during_chaos"] += int(ret.get("deltas", 0))
    for e in events:
        if e["ev"] in ("crash", "restart", "pause", "proc_error", "loop_died"):
            n[e["ev"]] += 1
        elif e["ev"] == "deliver":
            n["deliveries"] += 1
            n["redeliveries"] += int(e.get("deliveries", 1)) > 1
    n["kills"] = sum(1 for e in events if e["ev"] == "crash" and e.get("reason") == "chaos")
    n["handoffs"], n["handoff_min_gap_s"] = _handoffs(ix)
    n["lease_raised_after_delivery"] = sum(
        1 for e in events if e["ev"] == "deliver" and "until_at_delivery" in e
    )
    n["replicas_compared"] = sum(1 for e in events if e["ev"] == "replica")
    n["drained_by"] = next((e["by"] for e in events if e["ev"] == "drained"), "not drained in time")
    stats = [e for e in events if e["ev"] == "stats"]
    if stats:  # the engine's own count at the end, unacknowledged publishes that landed included
        n["final_backlog"] = sum(int(e["backlog"]) + int(e["in_flight"]) + int(e["delayed"]) for e in stats)
    return dict(sorted(n.items()))


def _handoffs(ix: Index) -> tuple[int, float | None]:
    """How many times a message went to another member while its holder had not settled it (its
    lease expired: a kill, a pause, a slow or dropped message), and the smallest gap seen."""
    gaps = [gap for _d1, _d2, gap in handoff_gaps(ix)]
    return len(gaps), (round(min(gaps), 3) if gaps else None)
