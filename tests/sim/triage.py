"""Triage: name the known flaw class a failing history most likely shows (a heuristic, for reports).

The checker says *which guarantee* broke; triage guesses *which known mechanism* broke it, from
the shape of the history, so that a batch can say "seed 123 is the stale-tail loss again" and a
new kind of failure stands out as ``other``. Classes (see the repro README of the review):

* ``r1`` / ``r1b`` stale tail after GC: an acknowledged publish landed at a segment number at or
  below one already acknowledged on that partition, or where another message was seen (the tail
  went backwards into numbers GC freed); ``r1b`` when the writer was a fresh producer process (it
  trusted a stale head hint);
* ``r2`` cursor-log fork after a long outage: a lease or ack violation, or diverging replicas, in a
  run with a pause longer than GC's delta grace (20 min);
* ``r3`` a paused member hands out leased messages: a double lease (or a delivery after an ack)
  whose later delivery went to a member that had been paused (or cut off from the store by an
  outage: the same stale prefetch);
* ``r4`` a new subscription stalls or misses messages: the cursor's floor names a segment that is
  not stored while later segments are (discovery 404s forever), or the lost message's segment was
  collected although the cursor had not reached it;
* ``r5`` a landed delta applied twice kills the consumer loop (ValueError);
* ``r6`` ``latest`` + partition growth skips messages of the new partitions;
* ``r7`` an idempotent publish stored twice;
* ``r8`` per-key order broken for an ordered consumer;
* ``deletion`` a publish acknowledged into (or lost with) a deleted topic;
* ``lost-delta`` (found by the simulator) a member whose cursor-log write lost its response or timed
  out hands out messages from a claim that is no longer current: a lease or ack violation whose
  later delivery follows such a fault of its process;
* ``join-unstarted`` (found by the simulator) ``register_consumer`` returned although a store
  failure left a partition's cursor unstarted; it starts later (``earliest``: after GC may have
  collected what was published meanwhile; ``latest``: past it), so publishes made after the join
  returned are never delivered;
* ``close-unanswered`` (found by the simulator) an ack/nack/extend still waiting when its consumer
  closes is never answered;
* ``r9``, ``r10``, ``r11``, ``clock-unreported``, ``lease-liveness`` (the round-two review; see
  ``_round_two``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .checker import Index, Violation
from .history import Event

LONG_PAUSE_S = 20 * 60.0


def classify(events: list[Event], violations: list[Violation]) -> list[str]:
    """Flaw classes (sorted) that explain ``violations``; ``other:<invariant>`` for the rest."""
    if not violations:
        return []
    ix = Index(events)
    labels: set[str] = set()
    long_pause = any(until - start > LONG_PAUSE_S for ps in ix.pauses.values() for start, until in ps)
    backwards = _backward_tails(ix)
    gaps = _floor_gaps(ix)
    floors = {
        (e["group"], e["topic"], e["partition"]): int(e["state"]["floor"])
        for e in events
        if e["ev"] == "fresh" and isinstance(e.get("state"), dict) and "floor" in e["state"]
    }
    stored = {(e["topic"], e["partition"], e["seq"]) for e in events if e["ev"] == "stored"}
    occupants: dict[tuple[Any, Any, Any], set[str]] = defaultdict(set)  # messages seen at each number
    for d in ix.deliveries:
        occupants[(d["topic"], d["partition"], d["seq"])].add(d["tag"])
    for c, r in ix.publishes():
        if r is not None and r["outcome"] == "ok" and not r.get("duplicate"):
            occupants[(c["topic"], r["partition"], r["seq"])].add(c["tag"])
    for e in events:
        if e["ev"] == "stored":
            occupants[(e["topic"], e["partition"], e["seq"])].update(str(t) for t in e["tags"])
    initial = {t["name"]: int(t.get("partitions", 1)) for t in ix.params.get("topics", [])}
    latest = {
        (c["group"], c["topic"]) for c, _ in ix.by_op.get("join", []) if c.get("start_position") == "latest"
    }
    family = ix.params.get("family")
    for v in violations:
        inv = v.invariant
        label: str | None = _round_two(ix, v, family)
        if label is not None:
            pass
        elif inv == "acked_publish_delivered":
            call, ret = v.events[0], v.events[1]
            group = v.message.rsplit(" ", 1)[-1]
            pos = (call["topic"], ret.get("partition"), ret.get("seq"))
            floor = floors.get((group, call["topic"], ret.get("partition")))
            if pos in backwards:
                label = backwards[pos]
            elif ix.has_deletes(call["topic"]):
                label = "deletion"
            elif len(occupants.get(pos, set()) - {call["tag"]}) > 0:
                # another message is known at this number: it was used (and freed by GC) before
                label = "r1b" if _first_write_of(ix, call) else "r1"
            elif any(
                e["ev"] == "loop_died" and e["error"] == "ValueError" and f".{group}." in e["proc"]
                for e in events
            ):
                label = "r5"  # a member of the group lost its loop (and its app waits on its acks for ever)
            elif (group, call["topic"]) in latest and int(ret.get("partition", 0)) >= initial.get(
                call["topic"], 1
            ):
                label = "r6"
            elif _join_faulted(ix, group, call["topic"]):
                label = "join-unstarted"
            elif (group, call["topic"], ret.get("partition")) in gaps or (
                floor is not None and int(ret.get("seq", 0)) >= floor and pos not in stored
            ):
                label = "r4"  # collected while its subscription's cursor had not reached it
        elif inv in ("exclusive_lease", "no_delivery_after_ack", "replicas_converge"):
            if long_pause:
                label = "r2"
            elif inv != "replicas_converge" and _cut_off_before(ix, v.events[-1]):
                label = "r3"  # the later delivery went to a member that had been stopped or cut off
            elif inv != "replicas_converge" and _lost_delta_before(ix, v.events[-1]):
                label = "lost-delta"
        elif inv == "engine_alive":
            text = v.message
            if (
                "ValueError" in text
                or "applied to state" in text
                or _loop_died_with(ix, v.events[0], "ValueError")
            ):
                label = "r5"
            elif (
                v.events and v.events[0].get("op") in ("ack", "nack", "extend") and _left_during(ix, v.events)
            ):
                label = "close-unanswered"
        elif inv == "dedup_stored_once":
            label = "r7"
        elif inv == "per_key_order":
            label = "r8"
        elif inv == "no_publish_into_deleted_topic":
            label = "deletion"
        labels.add(label or f"other:{inv}")
    return sorted(labels)


def _round_two(ix: Index, v: Violation, family: str | None) -> str | None:
    """The flaws of the round-two review, where their families and checks make them plain:

    * ``r9`` a member that kept running across its topic's deletion and re-creation forked the
      new topic's cursor log: a lease, ack or replica violation in a ``topic_recreate`` run;
      ``r9-unanswered`` it started over on the new topic and never answered the settlements its
      app was waiting on;
    * ``r10`` GC (or a producer) decided an age on its own clock: a loss, or a second copy of an
      idempotent publish, in a ``clocks`` run; ``clock-unreported`` a clock beyond the margin that
      said nothing (or one within it that warned);
    * ``r11`` a foreign object stopped a loop (GC died on a name it parsed with ``int()``) or was
      deleted by something that never wrote it;
    * ``lease-liveness`` an expired lease that came back later than the visibility timeout plus a
      few seconds (I16).
    """
    inv = v.invariant
    if inv == "clock_reported":
        return "clock-unreported"
    if inv == "foreign_objects_kept":
        return "r11"
    if inv == "lease_redelivered":
        return "lease-liveness"
    if inv == "engine_alive" and any(e.get("op") == "gc" for e in v.events) and "ValueError" in v.message:
        return "r11"
    if family == "topic_recreate" and inv in (
        "exclusive_lease",
        "no_delivery_after_ack",
        "replicas_converge",
        "acked_publish_delivered",
    ):
        return "r9"
    if (
        family == "topic_recreate"
        and inv == "engine_alive"
        and v.events[0].get("op") in ("ack", "nack", "extend")
    ):
        return "r9-unanswered"  # the member started over on the new topic and forgot the app's settlements
    if family == "clocks" and inv in ("acked_publish_delivered", "dedup_stored_once"):
        return "r10"
    return None


def _backward_tails(ix: Index) -> dict[tuple[Any, Any, Any], str]:
    """Positions (topic, partition, seq) of acknowledged publishes written at or below a segment
    number already acknowledged on that partition, labelled r1 (a producer's cached tail) or r1b
    (a fresh producer process)."""
    acked: list[tuple[Event, Event]] = [
        (c, r) for c, r in ix.publishes() if r is not None and r["outcome"] == "ok" and not r.get("duplicate")
    ]
    highest: dict[tuple[str, int], list[tuple[float, int]]] = defaultdict(list)  # (ret t, seq)
    for c, r in acked:
        highest[(c["topic"], r["partition"])].append((r["t"], r["seq"]))
    wrote_before: dict[tuple[str, str], float] = {}
    for c, r in acked:
        key = (c["proc"], c["topic"])
        wrote_before[key] = min(wrote_before.get(key, r["t"]), r["t"])
    out: dict[tuple[Any, Any, Any], str] = {}
    taken: dict[tuple[str, int, int], int] = defaultdict(int)
    for c, r in acked:
        taken[(c["topic"], r["partition"], r["seq"])] += 1
    for c, r in acked:
        if ix.has_deletes(c["topic"]):
            continue
        # the same number acknowledged twice, or a number below one acknowledged before this began
        earlier = [seq for t, seq in highest[(c["topic"], r["partition"])] if t < c["t"]]
        if taken[(c["topic"], r["partition"], r["seq"])] > 1 or (earlier and max(earlier) >= r["seq"]):
            fresh = wrote_before.get((c["proc"], c["topic"]), c["t"]) >= c["t"]
            out[(c["topic"], r["partition"], r["seq"])] = "r1b" if fresh else "r1"
    return out


def _floor_gaps(ix: Index) -> set[tuple[str, str, int]]:
    """(group, topic, partition) whose final cursor floor names a segment that is not stored while a
    later one is: discovery stops at the missing segment for good."""
    stored: dict[tuple[str, int], set[int]] = defaultdict(set)
    for e in ix.events:
        if e["ev"] == "stored":
            stored[(e["topic"], e["partition"])].add(e["seq"])
    out = set()
    for e in ix.events:
        if e["ev"] != "fresh" or not isinstance(e.get("state"), dict) or "floor" not in e["state"]:
            continue
        floor = int(e["state"]["floor"])
        segs = stored.get((e["topic"], e["partition"]), set())
        if floor not in segs and any(s > floor for s in segs):
            out.add((e["group"], e["topic"], e["partition"]))
    return out


def _left_during(ix: Index, events: list[Event]) -> bool:
    """The hung call's process began leaving its group while the call was open."""
    call = events[0]
    end = events[1]["t"] if len(events) > 1 else ix.end
    return any(
        c["proc"] == call["proc"] and call["t"] - 30.0 <= c["t"] <= end for c, _ in ix.by_op.get("leave", [])
    )


def _cut_off_before(ix: Index, delivery: Event) -> bool:
    """The delivering process was stopped, or could not reach the store, before the delivery."""
    proc = delivery.get("proc", "")
    return any(start <= delivery["t"] for start, _until in ix.pauses.get(proc, [])) or any(
        e["ev"] == "outage" and e["proc"] == proc and e["t"] <= delivery["t"] for e in ix.events
    )


def _lost_delta_before(ix: Index, delivery: Event) -> bool:
    return any(
        e["ev"] == "fault"
        and e["proc"] == delivery.get("proc")
        and e["kind"] in ("lost", "timeout")
        and "/subs/" in e["key"]
        and e["t"] <= delivery["t"]
        for e in ix.events
    )


def _loop_died_with(ix: Index, call: Event, error: str) -> bool:
    """The consumer loop of ``call``'s process died of ``error``."""
    return any(
        e["ev"] == "loop_died" and e["proc"] == call.get("proc") and e["error"] == error for e in ix.events
    )


def _join_faulted(ix: Index, group: str, topic: str) -> bool:
    """A successful join of ``group`` during which its process met a store fault."""
    for call, ret in ix.by_op.get("join", []):
        if call["group"] != group or call["topic"] != topic or ret is None or ret["outcome"] != "ok":
            continue
        if any(
            e["ev"] == "fault" and e["proc"] == call["proc"] and call["t"] <= e["t"] <= ret["t"]
            for e in ix.events
        ):
            return True
    return False


def _first_write_of(ix: Index, call: Event) -> bool:
    """``call`` is the first publish its process made on that topic (a fresh process's tail)."""
    return not any(
        c["proc"] == call["proc"] and c["topic"] == call["topic"] and c["t"] < call["t"]
        for c, _ in ix.publishes()
    )
