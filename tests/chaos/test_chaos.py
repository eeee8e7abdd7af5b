"""Chaos with real processes (file backend and SeaweedFS), and the checks' ability to fail.

The two process tests run the controller of ``harness.py``: producers, members of two consumer
groups and GC as separate processes on one bucket, kill -9'd, restarted and SIGSTOPped at random
for ``BUCKETQ_CHAOS_SECONDS`` (default 15; a soak run sets it much higher, e.g. 600), then
drained and checked. What they hold the engine to (each a check over the recorded histories):

* no acknowledged publish is lost: each is delivered to every group and done in a fresh load of
  the group's cursor at the end (the queue is drained to zero);
* no two live leases on one message: a member never receives a message while another member's
  lease on it (``Message.lease_until``, moved by committed extends) is live and unsettled, and on
  this one host clock not even within ``clock_skew_s`` after that lease ended (I4);
* nothing is delivered again in a group after an ack of it returned OK;
* and, as side checks: a segment number holds one message and a message one position (I1),
  member replicas equal a fresh load, no engine loop dies and no call hangs, no operation keeps
  failing and the engine's statistics read the final bucket (I8), only published messages are
  delivered.

Moto is not used: its conditional writes are not atomic under concurrency. ``BUCKETQ_CHAOS_SEED``
replays the controller's choices (the processes' timing is the machine's); every run's histories,
logs and ``result.json`` stay in its pytest temporary directory (or under ``BUCKETQ_CHAOS_DIR``),
printed with the numbers.

The unit tests below feed the same checks hand-made histories, one per violation, so a check that
silently accepted everything would fail here. What the runs found in the engine is reduced to
deterministic reproductions in ``test_findings.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from bucketq.bench.servers import S3Server

from .harness import Chaos, ChaosPlan, ChaosResult
from .histories import HistoryError, Index, check, merge, outstanding, parse_lines, settlement

CHAOS_SECONDS = float(os.environ.get("BUCKETQ_CHAOS_SECONDS", "15"))
# the test's own limit: chaos, plus start-up, quiesce and snapshot on a loaded machine
TIMEOUT_S = int(CHAOS_SECONDS + 240)


def _seed() -> int:
    env = os.environ.get("BUCKETQ_CHAOS_SEED")
    return int(env) if env else random.SystemRandom().randrange(2**31)


def _run_dir(tmp_path: Path, name: str) -> Path:
    """``BUCKETQ_CHAOS_DIR`` keeps every run's histories and logs (a soak's evidence); by default
    they live in the test's temporary directory."""
    keep = os.environ.get("BUCKETQ_CHAOS_DIR")
    if not keep:
        return tmp_path / "run"
    return Path(keep) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _run(settings: dict[str, Any], run_dir: Path) -> ChaosResult:
    plan = ChaosPlan(
        settings=settings | {"producer": {"linger_ms": 5}},
        seconds=CHAOS_SECONDS,
        seed=_seed(),
        quiesce_s=max(60.0, CHAOS_SECONDS / 4),
    )
    result = Chaos(plan, run_dir).run()
    print(result.report())  # the numbers, with -s (and in the failure message below)
    return result


def _assert_clean(result: ChaosResult) -> None:
    s, report = result.summary, result.report()
    assert result.error is None, report
    # the run did what it claims: a chaos test that exercised nothing would pass vacuously (the
    # rates depend on the machine's load: the floors are low)
    assert s.get("publish_ok", 0) >= 30 and s.get("deliveries", 0) >= 60, report
    assert s.get("kills", 0) >= 3 and s.get("pause", 0) >= 3, report
    assert s.get("gc_freed_segments", 0) > 0, "GC freed nothing: are the fence windows scaled?\n" + report
    assert s.get("replicas_compared", 0) > 0, report
    assert not result.violations, report
    assert not result.pending, "acknowledged publishes were not drained\n" + report


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_chaos_on_the_file_backend(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, "file")
    settings = {"backend": "file", "file_path": str(run_dir / "bucket"), "strategy": "conditional_write"}
    _assert_clean(_run(settings, run_dir))


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.timeout(TIMEOUT_S)
def test_chaos_on_seaweedfs(tmp_path: Path, seaweedfs_server: S3Server) -> None:
    settings = seaweedfs_server.settings_dict(strategy="conditional_write")
    _assert_clean(_run(settings, _run_dir(tmp_path, "seaweedfs")))


# -- the checks can fail: hand-made histories ------------------------------------------------------

EPOCH = 1_000_000.0
TOPIC = "chaos"
OVERLAP = {"exclusive_lease", "handoff_after_skew_margin"}  # overlapping leases break both


class Hand:
    """A hand-made history in the chaos processes' format: one JSON-lines text per process."""

    def __init__(self, clock_skew_s: float = 0.0) -> None:
        self.lines: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.cid: dict[str, int] = defaultdict(int)
        self.add(
            "controller",
            0.0,
            "run",
            seed=0,
            family="chaos",
            epoch=EPOCH,
            params={"hang_limit_s": 45, "clock_skew_s": clock_skew_s},
        )
        self.op("setup", 0.1, 0.2, "create_topic", topic=TOPIC)
        self.op("setup", 0.3, 0.4, "join", group="g1", topic=TOPIC, start_position="earliest", ordered=False)

    def add(self, writer: str, t: float, ev: str, **fields: Any) -> dict[str, Any]:
        """An event in ``writer``'s file (its ``proc`` unless the event names another process)."""
        event = {"t": t, "ev": ev, "proc": writer, **fields}
        self.lines[writer].append(event)
        return event

    def op(
        self,
        proc: str,
        t: float,
        ret_t: float | None,
        op: str,
        result: dict[str, Any] | None = None,
        outcome: str = "ok",
        error: str | None = None,
        **fields: Any,
    ) -> None:
        self.cid[proc] += 1
        self.add(proc, t, "call", cid=self.cid[proc], op=op, **fields)
        if ret_t is not None:
            extra = {"error": error} if error else {}
            self.add(proc, ret_t, "ret", cid=self.cid[proc], outcome=outcome, **extra, **(result or {}))

    def publish(self, tag: str, t: float, seq: int, idx: int = 0) -> None:
        self.op(
            "p#1",
            t,
            t + 0.1,
            "publish",
            {"partition": 0, "seq": seq, "index": idx},
            topic=TOPIC,
            tag=tag,
            key=None,
            dedup_id=None,
            delay=None,
        )

    def deliver(
        self,
        proc: str,
        member: str,
        tag: str,
        t: float,
        until_t: float,
        seq: int = 0,
        idx: int = 0,
        token: str = "tok",
    ) -> str:
        receipt = f"{TOPIC}:0:{seq}:{idx}:{token}"
        self.add(
            proc,
            t,
            "deliver",
            member=member,
            group="g1",
            topic=TOPIC,
            partition=0,
            seq=seq,
            idx=idx,
            tag=tag,
            key=None,
            receipt=receipt,
            until=EPOCH + until_t,
            skew=0.0,
            deliveries=1,
        )
        return receipt

    def settle(
        self,
        proc: str,
        op: str,
        receipt: str,
        tag: str,
        t: float,
        ret_t: float | None,
        outcome: str = "ok",
        result: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        _topic, _p, seq, idx, _tok = receipt.split(":")
        self.op(
            proc,
            t,
            ret_t,
            op,
            result,
            outcome,
            error,
            group="g1",
            topic=TOPIC,
            partition=0,
            seq=int(seq),
            idx=int(idx),
            tag=tag,
            receipt=receipt,
        )

    def final(self, done: list[int], count: int = 1, stored: list[str] | None = None, floor: int = 0) -> None:
        """The snapshot: g1's fresh cursor on p0 (segment 0 with ``done`` indexes), the fence, segments."""
        segments = {"0": {"count": count, "base": 0, "done": [[i, i] for i in done]}} if floor == 0 else {}
        state = {
            "n": 5,
            "started": True,
            "floor": floor,
            "floor_offset": 0,
            "frontier": 0,
            "segments": segments,
            "leases": [],
            "deliveries": [],
            "delayed": [],
            "counters": {"collected": 0},
            "ids": [],
        }
        self.add("snapshot", 90.0, "fresh", topic=TOPIC, group="g1", partition=0, state=state)
        self.add("snapshot", 90.1, "fence", topic=TOPIC, partition=0, floor=floor)
        if stored is not None:
            self.add(
                "snapshot",
                90.2,
                "stored",
                topic=TOPIC,
                partition=0,
                seq=0,
                tags=stored,
                dedups=[None] * len(stored),
            )

    def texts(self) -> list[tuple[str, str]]:
        return [
            (f"{proc}.jsonl", "".join(json.dumps(e) + "\n" for e in evs)) for proc, evs in self.lines.items()
        ]

    def violations(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = defaultdict(list)
        for v in check(merge(self.texts()).events):
            out[v.invariant].append(v.message)
        return dict(out)


def _clean() -> Hand:
    """One message published, delivered to A, acked; the snapshot agrees."""
    h = Hand()
    h.publish("p#1.0", 1.0, seq=0)
    r = h.deliver("a#1", "A", "p#1.0", 2.0, until_t=5.0)
    h.settle("a#1", "ack", r, "p#1.0", 2.5, 2.6)
    h.final(done=[0], stored=["p#1.0"])
    return h


def test_a_clean_hand_made_history_passes() -> None:
    assert _clean().violations() == {}


def test_a_lost_acknowledged_publish_is_reported() -> None:
    h = Hand()
    h.publish("p#1.0", 1.0, seq=0)
    h.final(done=[], count=0, stored=None)  # the cursor never saw it and the segment is gone
    h.lines["snapshot"][0]["state"]["segments"] = {}
    h.lines["snapshot"][0]["state"]["frontier"] = -1
    found = h.violations()
    assert "acked_publish_delivered" in found and "acked_publish_settled" in found, found


def test_a_publish_still_pending_in_the_cursor_is_undrained_not_lost() -> None:
    h = Hand()
    h.publish("p#1.0", 1.0, seq=0)
    h.final(done=[], stored=["p#1.0"])
    events = merge(h.texts()).events
    violations, pending = settlement(Index(events))
    assert violations == [] and [call["tag"] for _g, call, _r in pending] == ["p#1.0"]
    assert outstanding(events) == (1, 0)


def test_overlapping_live_leases_are_reported() -> None:
    h = Hand()
    h.publish("p#1.0", 1.0, seq=0)
    h.deliver("a#1", "A", "p#1.0", 2.0, until_t=5.0, token="t1")  # A holds it until t=5, never settles
    r = h.deliver("b#1", "B", "p#1.0", 4.0, until_t=7.0, token="t2")  # B gets it at t=4
    h.settle("b#1", "ack", r, "p#1.0", 4.5, 4.6)
    h.final(done=[0], stored=["p#1.0"])
    assert set(h.violations()) == OVERLAP


def test_a_delivery_after_the_holders_lease_expired_is_fine() -> None:
    h = Hand()
    h.publish("p#1.0", 1.0, seq=0)
    h.deliver("a#1", "A", "p#1.0", 2.0, until_t=3.0, token="t1")
    r = h.deliver("b#1", "B", "p#1.0", 4.0, until_t=7.0, token="t2")
    h.settle("b#1", "ack", r, "p#1.0", 4.5, 4.6)
    h.final(done=[0], stored=["p#1.0"])
    assert h.violations() == {}


def test_a_lease_moved_by_a_committed_extend_counts() -> None:
    """A's lease ran to t=3 at delivery; an extend that returned OK moved it to t=6."""
    h = Hand()
    h.publish("p#1.0", 1.0, seq=0)
    ra = h.deliver("a#1", "A", "p#1.0", 2.0, until_t=3.0, token="t1")
    h.settle("a#1", "extend", ra, "p#1.0", 2.5, 2.6, result={"until": EPOCH + 6.0})
    rb = h.deliver("b#1", "B", "p#1.0", 4.0, until_t=7.0, token="t2")
    h.settle("b#1", "ack", rb, "p#1.0", 4.5, 4.6)
    h.final(done=[0], stored=["p#1.0"])
    assert set(h.violations()) == OVERLAP


def test_a_lease_raised_after_delivery_counts() -> None:
    """Message.lease_until rose after the hand-out (a prefetch extend committed late): recorded as
    a ``lease`` event, it holds A's lease to the later deadline."""
    h = Hand()
    h.publish("p#1.0", 1.0, seq=0)
    ra = h.deliver("a#1", "A", "p#1.0", 2.0, until_t=3.0, token="t1")
    h.add("a#1", 2.2, "lease", receipt=ra, until=EPOCH + 6.0)
    rb = h.deliver("b#1", "B", "p#1.0", 4.0, until_t=7.0, token="t2")
    h.settle("b#1", "ack", rb, "p#1.0", 4.5, 4.6)
    h.final(done=[0], stored=["p#1.0"])
    assert set(h.violations()) == OVERLAP


def test_a_hand_off_inside_the_clock_skew_margin_is_reported() -> None:
    """On one host clock a member takes an expired lease only ``clock_skew_s`` after it ended (I4)."""
    for gap, expected in ((0.1, {"handoff_after_skew_margin"}), (0.3, set())):
        h = Hand(clock_skew_s=0.25)
        h.publish("p#1.0", 1.0, seq=0)
        h.deliver("a#1", "A", "p#1.0", 2.0, until_t=3.0, token="t1")
        r = h.deliver("b#1", "B", "p#1.0", 3.0 + gap, until_t=7.0, token="t2")
        h.settle("b#1", "ack", r, "p#1.0", 4.5, 4.6)
        h.final(done=[0], stored=["p#1.0"])
        assert set(h.violations()) == expected, gap


def test_a_delivery_after_an_ok_ack_is_reported() -> None:
    h = _clean()  # A acked OK at t=2.6
    h.deliver("b#1", "B", "p#1.0", 6.0, until_t=9.0, token="t2")  # after A's lease: only the ack is broken
    assert list(h.violations()) == ["no_delivery_after_ack"]


def test_a_delivery_after_a_refused_ack_is_fine() -> None:
    h = Hand()
    h.publish("p#1.0", 1.0, seq=0)
    ra = h.deliver("a#1", "A", "p#1.0", 2.0, until_t=3.0, token="t1")
    rb = h.deliver("b#1", "B", "p#1.0", 4.0, until_t=7.0, token="t2")
    h.settle("a#1", "ack", ra, "p#1.0", 4.1, 4.2, outcome="error", error="LeaseLost")
    h.settle("b#1", "ack", rb, "p#1.0", 4.5, 4.6)
    h.final(done=[0], stored=["p#1.0"])
    assert h.violations() == {}


def test_a_segment_number_taken_twice_is_reported() -> None:
    h = _clean()
    h.lines["snapshot"][-1]["tags"] = ["someone-else.7"]  # seg 0 now holds another message
    found = h.violations()
    assert "one_position_per_message" in found, found
    assert any("taken twice" in m for m in found["one_position_per_message"])


def test_a_message_stored_twice_is_reported() -> None:
    h = _clean()
    h.lines["snapshot"][-1]["tags"] = ["p#1.0", "p#1.0"]
    h.lines["snapshot"][0]["state"]["segments"]["0"]["count"] = 2
    assert list(h.violations()) == ["one_position_per_message"]


def test_orphans_below_the_floor_fence_are_not_messages() -> None:
    """A fenced writer's orphan below the floor (I1) holds copies nobody reads: not a duplicate."""
    h = _clean()
    h.add("snapshot", 90.3, "stored", topic=TOPIC, partition=0, seq=1, tags=["p#1.0"], dedups=[None])
    h.lines["snapshot"][1]["floor"] = 0
    assert "one_position_per_message" in h.violations()
    h.lines["snapshot"][1]["floor"] = 2  # both below the fence: freed and orphan
    h.lines["snapshot"][0]["state"]["floor"] = 2
    assert h.violations() == {}


def _failures(h: Hand, proc: str, op: str, times: list[float]) -> None:
    for n, t in enumerate(times):
        fields: dict[str, Any] = {}
        if op == "publish":
            fields = {"topic": TOPIC, "tag": f"{proc}.x{n}", "key": None, "dedup_id": None, "delay": None}
        h.op(proc, t, t + 0.01, op, outcome="error", error="StorageError", **fields)


def test_an_operation_that_keeps_failing_is_reported() -> None:
    """A producer that can no longer publish (or a GC that can no longer collect) is stuck (I8)."""
    h = _clean()
    _failures(h, "p#1", "publish", [10.0, 11.0, 12.0, 13.0, 14.0])
    assert set(h.violations()) == {"no_persistent_failure"}
    h = _clean()  # 4 failures, the success at t=1, 4 failures: each streak is short
    _failures(h, "p#1", "publish", [0.50, 0.55, 0.60, 0.65, 10.0, 11.0, 12.0, 13.0])
    assert h.violations() == {}
    h = _clean()
    _failures(h, "gc#1", "gc", [10.0, 11.0, 12.0])
    assert set(h.violations()) == {"no_persistent_failure"}


def test_statistics_that_fail_on_the_final_bucket_are_reported() -> None:
    h = _clean()
    h.add("snapshot", 91.0, "stats_failed", error="StorageError", msg="corrupt segment header")
    assert set(h.violations()) == {"snapshot_readable"}


def test_a_cursor_that_cannot_be_loaded_at_the_end_is_reported() -> None:
    h = _clean()
    h.lines["snapshot"][0]["state"] = {"error": "JSONDecodeError: Expecting value: line 1 column 1 (char 0)"}
    found = h.violations()
    assert set(found) == {"acked_publish_settled"} and "cannot be loaded" in found["acked_publish_settled"][0]


def test_a_killed_processs_partial_last_line_is_dropped() -> None:
    h = _clean()
    texts = h.texts()
    name, text = next((n, t) for n, t in texts if n == "a#1.jsonl")
    cut = text + '{"t": 3.0, "ev": "call", "proc": "a#1", "cid"'  # killed mid-write
    merged = merge([(n, cut if n == name else t) for n, t in texts])
    assert merged.partial_lines == 1
    assert check(merged.events) == []
    events, partial = parse_lines('{"ev": "x", "t": 1}', "f")  # cut just before its newline: whole
    assert partial == 0 and events == [{"ev": "x", "t": 1}]
    with pytest.raises(HistoryError):
        parse_lines('{"ev": "x", "t": 1}\n{"ev": \n{"ev": "y", "t": 2}\n', "f")


def test_call_ids_are_per_process() -> None:
    """Two processes both number their calls from 1: their returns must not cross."""
    h = Hand()
    h.publish("p#1.0", 1.0, seq=0)
    ra = h.deliver("a#1", "A", "p#1.0", 2.0, until_t=3.0, token="t1")
    h.settle("a#1", "ack", ra, "p#1.0", 2.5, None)  # A was killed in its ack: no return
    h.add("controller", 2.7, "crash", proc="a#1", signal="SIGKILL", reason="chaos")
    rb = h.deliver("b#1", "B", "p#1.0", 4.0, until_t=7.0, token="t2")
    h.settle("b#1", "ack", rb, "p#1.0", 4.5, 4.6)
    h.final(done=[0], stored=["p#1.0"])
    events = merge(h.texts()).events
    calls = {e["cid"]: e for e in events if e["ev"] == "call"}
    rets = [e for e in events if e["ev"] == "ret"]
    assert all(calls[r["cid"]]["proc"] == r["proc"] for r in rets)
    assert check(events) == []


# -- a finding of the chaos runs: GC frees nothing while traffic is steady -----------------------


@pytest.mark.slow
async def test_gc_frees_while_traffic_is_steady() -> None:
    """Liveness of GC: with collections more frequent than the grace (as the operator's 300 s timer
    is against the 1,200 s delta grace) and a consumer that keeps up, consumed segments and old
    deltas are freed while the traffic goes on, not only after it stops."""
    from bucketq import Bucketq, Settings

    settings = Settings.from_dict(
        {
            "backend": "memory",
            "strategy": "conditional_write",
            "producer": {"linger_ms": 2},
            "consumer": {"poll_min_ms": 5, "poll_max_ms": 20, "checkpoint_every": 4},
        }
    )
    freed = {"segments": 0, "deltas": 0}
    async with Bucketq(settings) as bq:
        await bq.create_topic("steady", retention_seconds=0.1)
        producer = await bq.register_producer("p")
        consumer = await bq.register_consumer("g", "steady")
        end = asyncio.get_running_loop().time() + 6.0

        def running() -> bool:
            return asyncio.get_running_loop().time() < end

        async def produce() -> None:
            n = 0
            while running():
                await producer.publish("steady", n)
                n += 1
                await asyncio.sleep(0.02)

        async def consume() -> None:
            while running():
                for m in await consumer.poll(20, 0.1):
                    await m.ack()

        async def collect() -> None:
            while running():
                await asyncio.sleep(0.4)  # collections 2.5x as frequent as the segment grace below
                report = await bq.collect_garbage(segment_grace_s=1.0, delta_grace_s=1.0)
                freed["segments"] += report.segments
                freed["deltas"] += report.deltas

        await asyncio.gather(produce(), consume(), collect())
    assert freed["segments"] > 0 and freed["deltas"] > 0, (
        f"6 s of steady traffic, GC every 0.4 s: freed {freed}"
    )
