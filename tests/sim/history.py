"""The recorded history of one simulation: JSON-serialisable events, one per line.

Every event is a flat dict with ``i`` (its index), ``t`` (virtual seconds since the start, not
skewed: the true order of events) and ``ev`` (its kind). The checker reads nothing else, so a
history written by real processes (chaos tests) can be checked the same way.

Event kinds (fields beyond i/t/ev):

* ``run``      seed, family, epoch (wall-clock time at t=0), params: the schedule (first event);
* ``call``     cid, proc, op, and the op's arguments: an application call starts. Ops:
  ``publish`` (topic, tag, key, dedup_id, delay), ``join`` (group, topic, start_position,
  ordered), ``leave``, ``ack``/``nack``/``extend`` (the delivery's receipt and position),
  ``gc``, ``grow`` (topic, partitions), ``create_topic``/``delete_topic`` (topic), ``job`` (job,
  topic, run, tags: one run of a write job, from its driver's ``prepare_job`` through its tasks'
  chunks to ``commit_job``), ``job_abort`` (job, topic, run: ``abort_job`` after a failed run);
* ``ret``      cid, outcome (``ok`` | ``error`` | ``bug`` | ``crashed`` | ``cancelled``), error,
  and the op's result (publish: partition, seq, index, duplicate; join: member; extend: until;
  job: txn, recovered, messages);
* ``deliver``  proc, member, group, topic, partition, seq, idx, tag, id (the message id), key,
  receipt, until (the lease deadline the app was given, in its process's wall clock), skew,
  deliveries: a message handed to the application by ``poll``;
* ``crash`` / ``restart`` / ``pause`` (proc, until) / ``outage`` (proc, until) / ``fault``;
* ``loop_died`` proc, member, error: a consumer's background loop ended by an exception;
* ``overdue``  proc, op, started, waited: a call that did not return within the hang limit;
* ``replica`` / ``fresh``  topic, group, partition, member, state: cursor states at the end;
* ``stored``   topic, partition, seq, tags, dedups, keys (and dlq_for: the group of each dead-letter
  copy; txn, chunk: a job commit's chunk): a segment found in the bucket at the end;
* ``txn``      topic, id, job, owner, state (``pending`` | ``committed`` | ``aborted`` | ``deleted``),
  reason, partitions (per partition, each chunk's seq or null): the store applied a write (or the
  deletion) of a transaction record; the store's view, recorded when applied (``jobs.TxnJournal``);
* ``phase``    name (chaos | quiesce | final | end).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from .clock import VirtualClock

Event = dict[str, Any]


class History:
    """Append-only list of events, timestamped with the virtual clock."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.events: list[Event] = []
        self._next_cid = 0

    def record(self, ev: str, **fields: Any) -> Event:
        event: Event = {"i": len(self.events), "t": round(self.clock.now, 6), "ev": ev, **fields}
        self.events.append(event)
        return event

    def new_cid(self) -> int:
        self._next_cid += 1
        return self._next_cid


def to_jsonl(events: Iterable[Event]) -> str:
    return "".join(json.dumps(e, sort_keys=True, separators=(",", ":")) + "\n" for e in events)


def from_jsonl(text: str) -> list[Event]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def digest(events: Iterable[Event]) -> str:
    """SHA-256 of the canonical JSON lines: equal digests mean identical histories."""
    return hashlib.sha256(to_jsonl(events).encode()).hexdigest()
