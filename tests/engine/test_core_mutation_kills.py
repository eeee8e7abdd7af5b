"""Tests that pin down what the mutation review of ``bucketq/core`` found loose (``make mutate``).

Each test sets up one situation where a plausible wrong version of the code gives a visibly wrong
result: a 412 taken as "our segment landed" when another writer's segment is there, ``load()``
starting from an old checkpoint, a fence copy trusted a moment too long, and so on. All run on
the in-memory store, with no sleeps longer than a backoff.
"""

from __future__ import annotations

import asyncio
import json
import math
import time

import pytest

from bucketq import Bucketq
from bucketq.config import ConsumerSettings
from bucketq.core import consumer as consumer_module
from bucketq.core import cursor_log, fences, partition_worker, segment_writer
from bucketq.core.cursor import CursorState, Delta, Op, apply_delta
from bucketq.core.cursor_log import CursorLog
from bucketq.core.fences import FenceValue, raise_fence
from bucketq.core.keys import Keys
from bucketq.core.message import Message, Receipt
from bucketq.core.partition_worker import PartitionWorker
from bucketq.core.segment import Record, Segment, SegmentHeader, decode_segment, encode_segment
from bucketq.core.segment_writer import SegmentWriter
from bucketq.errors import Contended, PublishTimeout, StorageError
from bucketq.storage import MemoryStore, Storage
from bucketq.storage.faults import FaultyStore

TOPIC = "t"


def line(payload: str) -> bytes:
    return json.dumps({"id": payload, "payload": payload}).encode()


async def segment_at(storage: Storage, keys: Keys, seq: int) -> tuple[str, int, list[str]]:
    """(batch id, base, message ids) of the segment stored at ``seq``."""
    blob = await storage.get(keys.segment(TOPIC, 0, seq))
    assert blob is not None, f"segment {seq} is missing"
    segment = decode_segment(blob.data)
    return segment.header.batch, segment.header.base, [r.id for r in segment.records]


async def segment_numbers(storage: Storage, keys: Keys) -> list[int]:
    return [
        int(i.key.rsplit("/", 1)[1].split(".")[0]) async for i in storage.list(keys.segments_prefix(TOPIC, 0))
    ]


NOW = 1000.0


class StillClock:
    """Stands in for the ``time`` module of one engine module: the wall clock stands at ``now``;
    the monotonic one runs, or stands at ``monotonic`` when given."""

    def __init__(self, now: float, monotonic: float | None = None) -> None:
        self.now = now
        self.still_monotonic = monotonic

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return time.monotonic() if self.still_monotonic is None else self.still_monotonic


# -- segments: a 412 means "taken", and only our batch id means "taken by us" ----------------------


async def test_412_on_another_writers_segment_moves_to_the_next_number() -> None:
    """The writer's cached tail points at a number another writer has just taken: the PUT gets a
    real 412 with that writer's segment behind it. The batch must land at the next number, after
    the other segment's messages, and both segments stay intact."""
    storage = Storage(MemoryStore())
    keys = Keys()
    conflicts: list[int] = []
    writer = SegmentWriter(storage, keys, TOPIC, 0, "w1", on_conflict=lambda: conflicts.append(1))
    first = await writer.append([line("a0")], "batch-a")
    assert (first.seq, first.base, writer.next_seq) == (0, 0, 1)
    # another producer takes numbers 1 (two messages) and 2 (one) behind this writer's back
    other = SegmentHeader(TOPIC, 0, 1, 2, 1, "w2", time.time(), "batch-other")
    await storage.create(keys.segment(TOPIC, 0, 1), encode_segment(other, [line("x0"), line("x1")]))
    again = SegmentHeader(TOPIC, 0, 2, 1, 3, "w2", time.time(), "batch-again")
    await storage.create(keys.segment(TOPIC, 0, 2), encode_segment(again, [line("y0")]))

    landed = await writer.append([line("b0"), line("b1"), line("b2")], "batch-b")

    assert (landed.seq, landed.base, landed.count) == (3, 4, 3), (
        "the next free number, after the others' messages"
    )
    assert writer.conflicts == 2 and conflicts == [1, 1]
    assert (writer.next_seq, writer.next_offset) == (4, 7)
    assert await segment_at(storage, keys, 1) == ("batch-other", 1, ["x0", "x1"])
    assert await segment_at(storage, keys, 2) == ("batch-again", 3, ["y0"])
    assert await segment_at(storage, keys, 3) == ("batch-b", 4, ["b0", "b1", "b2"])
    assert await segment_numbers(storage, keys) == [0, 1, 2, 3]


async def test_412_on_our_own_segment_after_a_lost_response_is_success() -> None:
    """The PUT landed but its response was lost; the retry gets 412 and finds our batch id there:
    that is our write (same number, no second copy, no conflict)."""
    faulty = FaultyStore(MemoryStore())
    storage = Storage(faulty)
    keys = Keys()
    writer = SegmentWriter(storage, keys, TOPIC, 0, "w1")
    await writer.append([line("a0")], "batch-a")
    faulty.add(op="PUT", match="*/seg/*", kind="drop_after_write", times=1)

    landed = await writer.append([line("b0"), line("b1")], "batch-b")

    assert faulty.injected["drop_after_write"] == 1
    assert (landed.seq, landed.base, landed.count) == (1, 1, 2)
    assert writer.conflicts == 0
    assert (writer.next_seq, writer.next_offset) == (2, 3)
    assert await segment_at(storage, keys, 1) == ("batch-b", 1, ["b0", "b1"])
    assert await segment_numbers(storage, keys) == [0, 1], "the batch is stored once"


async def test_412_whose_segment_vanished_finds_the_real_tail() -> None:
    """A 412 with nothing behind it (taken, then freed by GC): neither ours nor a base to continue
    from, so the writer looks for the real tail instead of trusting its cached one."""
    faulty = FaultyStore(MemoryStore())
    storage = Storage(faulty)
    keys = Keys()
    writer = SegmentWriter(storage, keys, TOPIC, 0, "w1")
    await writer.append([line("a0")], "batch-a")
    faulty.add(op="PUT", match="*/seg/*", kind="precondition", times=1)  # 412, nothing written

    landed = await writer.append([line("b0")], "batch-b")

    assert (landed.seq, landed.base) == (1, 1)
    assert writer.conflicts == 1
    assert await segment_numbers(storage, keys) == [0, 1]


# -- cursor logs: load() starts from the newest checkpoint -----------------------------------------


async def test_load_starts_from_the_newest_checkpoint() -> None:
    """Two checkpoints (4 and 8) and the deltas up to the newest one collected: only a load from
    the newest checkpoint reaches the tip. One from the older checkpoint stops at its first
    missing delta with a short state."""
    storage = Storage(MemoryStore())
    keys = Keys()
    writer = CursorLog(storage, keys, TOPIC, "c", 0, "W", checkpoint_every=4)
    await writer.commit(lambda s: [Op("start", seq=0, base=0)])
    for _ in range(9):
        await writer.commit(lambda s: [Op("seen", s.frontier + 1, count=1, base=s.frontier + 1)])
    await _settle_checkpoints(storage, keys, [4, 8])
    await storage.delete([keys.delta(TOPIC, "c", 0, n) for n in range(1, 9)])

    loaded = await CursorLog(storage, keys, TOPIC, "c", 0, "R").load()

    assert loaded.n == 10
    assert loaded.to_json() == writer.state.to_json()


async def _settle_checkpoints(storage: Storage, keys: Keys, expected: list[int]) -> None:
    """Wait for the background checkpoint writes (a few event-loop turns on the memory store)."""
    prefix = keys.checkpoints_prefix(TOPIC, "c", 0)
    deadline = time.monotonic() + 5
    while True:
        found = [
            CursorState.from_json(json.loads((await storage.get(i.key)).data)).n  # type: ignore[union-attr]
            async for i in storage.list(prefix)
        ]
        if found == expected or time.monotonic() > deadline:
            assert found == expected
            return
        await asyncio.sleep(0.01)


async def test_load_refuses_a_newest_checkpoint_below_the_trim_fence() -> None:
    """The newest checkpoint must reach the fence: ``n + 1 == floor`` is fine (the deltas after it
    are all kept), one below is a log somebody cut by hand, refused rather than built wrong."""
    storage = Storage(MemoryStore())
    keys = Keys()
    writer = CursorLog(storage, keys, TOPIC, "c", 0, "W", checkpoint_every=4)
    await writer.commit(lambda s: [Op("start", seq=0, base=0)])
    for _ in range(5):
        await writer.commit(lambda s: [Op("seen", s.frontier + 1, count=1, base=s.frontier + 1)])
    await _settle_checkpoints(storage, keys, [4])
    trim = keys.log_trim(TOPIC, "c", 0)
    await raise_fence(storage, trim, FenceValue(5))
    reader = CursorLog(storage, keys, TOPIC, "c", 0, "R")
    assert (await reader.load()).n == 6
    assert (await reader.load()).n == 6
    assert reader.reloads == 2
    await raise_fence(storage, trim, FenceValue(6))
    with pytest.raises(StorageError, match="below the trim fence 6"):
        await CursorLog(storage, keys, TOPIC, "c", 0, "R2").load()


async def test_catch_up_via_checkpoint_jumps_to_a_newer_checkpoint() -> None:
    """A replica that looks in now and then loads the newest checkpoint above its tip first: the
    deltas between its tip and that checkpoint may be gone."""
    storage = Storage(MemoryStore())
    keys = Keys()
    writer = CursorLog(storage, keys, TOPIC, "c", 0, "W", checkpoint_every=4)
    await writer.commit(lambda s: [Op("start", seq=0, base=0)])
    replica = CursorLog(storage, keys, TOPIC, "c", 0, "R")
    await replica.load()
    for _ in range(9):
        await writer.commit(lambda s: [Op("seen", s.frontier + 1, count=1, base=s.frontier + 1)])
    await _settle_checkpoints(storage, keys, [4, 8])
    await storage.delete([keys.delta(TOPIC, "c", 0, n) for n in range(2, 9)])
    assert await replica.catch_up(via_checkpoint=True) == 9
    assert replica.state.to_json() == writer.state.to_json()
    assert await replica.catch_up(via_checkpoint=True) == 0, "nothing new: nothing applied"


async def test_catch_up_counts_the_deltas_it_applied() -> None:
    storage = Storage(MemoryStore())
    keys = Keys()
    writer = CursorLog(storage, keys, TOPIC, "c", 0, "W")
    replica = CursorLog(storage, keys, TOPIC, "c", 0, "R")
    await writer.commit(lambda s: [Op("start", seq=0, base=0)])
    await writer.commit(lambda s: [Op("seen", 0, count=1, base=0)])
    assert await replica.catch_up() == 2
    assert await replica.catch_up() == 0
    assert replica.state.to_json() == writer.state.to_json()


async def test_commit_with_nothing_to_say_writes_nothing() -> None:
    storage = Storage(MemoryStore())
    keys = Keys()
    log = CursorLog(storage, keys, TOPIC, "c", 0, "W")
    assert await log.commit(lambda s: []) is None
    assert [i async for i in storage.list(keys.deltas_prefix(TOPIC, "c", 0))] == []


async def test_commit_rebases_on_412_and_counts_the_conflict() -> None:
    """Another member took our number: catch up, build the ops again on the new state, write at
    the next number; the outcome says how many rebases it took."""
    storage = Storage(MemoryStore())
    keys = Keys()
    a = CursorLog(storage, keys, TOPIC, "c", 0, "A", clock=lambda: 1000.0)
    b = CursorLog(storage, keys, TOPIC, "c", 0, "B", clock=lambda: 1000.0)
    await a.commit(lambda s: [Op("start", seq=0, base=0), Op("seen", 0, count=2, base=0)])
    await b.load()
    await a.commit(lambda s: [Op("claim", 0, 0, token="ta", member="A", until=1030.0)])
    built_on: list[int] = []

    def claim_first_free(state: CursorState) -> list[Op]:
        built_on.append(state.n)
        free = next(p for p in state.open_positions() if state.claimable(p, 1000.0))
        return [Op("claim", *free, token="tb", member="B", until=1030.0)]

    outcome = await b.commit(claim_first_free)
    assert outcome is not None
    assert built_on == [1, 2], "built again on the state that includes A's delta"
    assert (outcome.delta.n, outcome.results, outcome.conflicts, b.conflicts) == (3, [True], 1, 1)
    assert outcome.delta.ops[0].pos == (0, 1)


async def test_commit_counts_every_412_it_rebased_on() -> None:
    faulty = FaultyStore(MemoryStore())
    log = CursorLog(Storage(faulty), Keys(), TOPIC, "c", 0, "A")
    faulty.add(op="PUT", match="*/log/*", kind="precondition", times=2)
    outcome = await log.commit(lambda s: [Op("start", seq=0, base=0)])
    assert outcome is not None and (outcome.delta.n, outcome.results) == (1, [True])
    assert outcome.conflicts == 2 and log.conflicts == 2


async def test_commit_gives_up_after_max_attempts() -> None:
    faulty = FaultyStore(MemoryStore())
    storage = Storage(faulty)
    log = CursorLog(storage, Keys(), TOPIC, "c", 0, "A", max_attempts=2)
    faulty.add(op="PUT", match="*/log/*", kind="error", times=None)
    with pytest.raises(StorageError, match="injected fault"):
        await log.commit(lambda s: [Op("start", seq=0, base=0)])
    assert faulty.injected["error"] == 2, "exactly max_attempts PUTs"


async def test_commit_gives_up_after_max_attempts_of_412() -> None:
    faulty = FaultyStore(MemoryStore())
    storage = Storage(faulty)
    log = CursorLog(storage, Keys(), TOPIC, "c", 0, "A", max_attempts=3)
    faulty.add(op="PUT", match="*/log/*", kind="precondition", times=None)
    with pytest.raises(StorageError, match="gave up after 3 attempts"):
        await log.commit(lambda s: [Op("start", seq=0, base=0)])
    assert faulty.injected["precondition"] == 3


async def test_commit_retries_a_storage_error_and_lands_once() -> None:
    faulty = FaultyStore(MemoryStore())
    storage = Storage(faulty)
    keys = Keys()
    log = CursorLog(storage, keys, TOPIC, "c", 0, "A", max_attempts=3)
    faulty.add(op="PUT", match="*/log/*", kind="error", times=2)
    outcome = await log.commit(lambda s: [Op("start", seq=0, base=0)])
    assert outcome is not None and (outcome.delta.n, outcome.results) == (1, [True])
    assert [i.key async for i in storage.list(keys.deltas_prefix(TOPIC, "c", 0))] == [
        keys.delta(TOPIC, "c", 0, 1)
    ]


async def test_lost_response_then_412_is_our_own_delta() -> None:
    """The PUT landed, its response was lost; the byte-identical retry gets 412: the log says the
    delta is ours, so its results are returned and it is applied once."""
    faulty = FaultyStore(MemoryStore())
    storage = Storage(faulty)
    keys = Keys()
    log = CursorLog(storage, keys, TOPIC, "c", 0, "A")
    await log.commit(lambda s: [Op("start", seq=0, base=0)])
    faulty.add(op="PUT", match="*/log/*", kind="drop_after_write", times=1)
    outcome = await log.commit(lambda s: [Op("seen", 0, count=2, base=0), Op("seen", 5, count=1, base=2)])
    assert outcome is not None
    assert (outcome.delta.n, outcome.results, outcome.conflicts) == (2, [True, False], 0)
    assert log.state.n == 2 and log.state.frontier == 0
    assert log._inflight is None
    fresh = await CursorLog(storage, keys, TOPIC, "c", 0, "X").load()
    assert fresh.to_json() == log.state.to_json()


async def test_lost_delta_whose_number_another_member_took_is_built_again() -> None:
    """Our write failed (not landed), and before we retried another member took the number: our
    ops are built again on the new state, at the next number."""
    faulty = FaultyStore(MemoryStore())
    storage = Storage(faulty)
    keys = Keys()
    a = CursorLog(storage, keys, TOPIC, "c", 0, "A", max_attempts=1)
    b = CursorLog(storage, keys, TOPIC, "c", 0, "B")
    await a.commit(lambda s: [Op("start", seq=0, base=0)])
    faulty.add(op="PUT", match="*/log/*", kind="error", times=1)
    with pytest.raises(StorageError):
        await a.commit(lambda s: [Op("seen", s.frontier + 1, count=1, base=s.frontier + 1)])
    assert a._inflight is not None
    await b.commit(lambda s: [Op("seen", s.frontier + 1, count=1, base=s.frontier + 1)])
    outcome = await a.commit(lambda s: [Op("seen", s.frontier + 1, count=1, base=s.frontier + 1)])
    assert outcome is not None and outcome.delta.n == 3 and outcome.results == [True]
    assert a.state.frontier == 1, "B's segment 0, then ours as segment 1: nothing applied twice"


async def test_landed_delta_covered_by_a_checkpoint_is_judged_from_the_state() -> None:
    """Our delta landed (response lost) and, before we looked again, the log moved on past a
    checkpoint and the deltas were collected: ``state.ids`` says it was ours, and each op is
    judged from the state (I3)."""
    faulty = FaultyStore(MemoryStore())
    storage = Storage(faulty)
    keys = Keys()
    a = CursorLog(storage, keys, TOPIC, "c", 0, "A", max_attempts=1, clock=lambda: 1000.0)
    b = CursorLog(storage, keys, TOPIC, "c", 0, "B", checkpoint_every=4, clock=lambda: 1000.0)
    await a.commit(lambda s: [Op("start", seq=0, base=0), Op("seen", 0, count=4, base=0)])
    faulty.add(op="PUT", match="*/log/*", kind="drop_after_write", times=1)
    ours = [
        Op("claim", 0, 0, token="t0", member="A", until=1030.0),
        Op("claim", 0, 1, token="t1", member="A", until=1030.0),
    ]
    with pytest.raises(StorageError):
        await a.commit(lambda s: ours)
    await b.load()
    await b.commit(lambda s: [Op("ack", 0, 1, token="t1")])  # our second claim is acked already
    await b.commit(lambda s: [Op("seen", 1, count=1, base=4)])
    await _settle_checkpoints(storage, keys, [4])
    await storage.delete([keys.delta(TOPIC, "c", 0, n) for n in range(1, 5)])
    await a.load()
    outcome = await a.commit(lambda s: [])
    assert outcome is not None and outcome.delta.n == 2
    assert outcome.results == [True, False], "claim 0 still ours; claim 1 no longer held"
    assert outcome.conflicts == 0


async def test_clock_skew_is_reported_only_beyond_the_margin(caplog: pytest.LogCaptureFixture) -> None:
    storage = Storage(MemoryStore())
    keys = Keys()
    at = [1002.0]
    writer = CursorLog(storage, keys, TOPIC, "c", 0, "W", clock=lambda: at[0])
    reader = CursorLog(storage, keys, TOPIC, "c", 0, "R", clock=lambda: 1000.0, clock_skew_s=2.0)
    await writer.commit(lambda s: [Op("start", seq=0, base=0)])
    with caplog.at_level("WARNING", logger="bucketq.cursor"):
        await reader.load()
    assert reader.skew_seen == 2.0
    assert "ahead of ours" not in caplog.text, "a lead of exactly the margin is within it"
    at[0] = math.nextafter(1002.0, math.inf)
    await writer.commit(lambda s: [Op("seen", 0, count=1, base=0)])
    at[0] = 1001.0
    await writer.commit(lambda s: [Op("seen", 1, count=1, base=1)])
    with caplog.at_level("WARNING", logger="bucketq.cursor"):
        await reader.catch_up()
    assert reader.skew_seen == math.nextafter(1002.0, math.inf) - 1000.0, "the largest lead is kept"
    assert caplog.text.count("ahead of ours") == 1


async def test_a_delta_with_an_op_of_unknown_kind_is_reported_and_its_other_ops_apply(
    caplog: pytest.LogCaptureFixture,
) -> None:
    storage = Storage(MemoryStore())
    keys = Keys()
    writer = CursorLog(storage, keys, TOPIC, "c", 0, "W", clock=lambda: 1000.0)
    await writer.commit(lambda s: [Op("start", seq=0, base=0)])
    newer = {"v": 1, "n": 2, "member": "N", "id": "x", "at": 1000.0}
    ops = [{"op": "teleport", "seq": 0}, Op("seen", 0, count=1, base=0).to_json()]
    await storage.create(keys.delta(TOPIC, "c", 0, 2), json.dumps({**newer, "ops": ops}).encode())
    reader = CursorLog(storage, keys, TOPIC, "c", 0, "R", clock=lambda: 1000.0)
    with caplog.at_level("WARNING", logger="bucketq.cursor"):
        state = await reader.load()
    assert "unknown kinds teleport" in caplog.text
    assert (state.n, state.frontier) == (2, 0), "the seen op beside it applied"


async def test_own_clock_ahead_is_measured_but_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    storage = Storage(MemoryStore())
    keys = Keys()
    now = [1100.0]
    log = CursorLog(storage, keys, TOPIC, "c", 0, "A", clock=lambda: now[0], clock_skew_s=2.0)
    await log.commit(lambda s: [Op("start", seq=0, base=0)])
    now[0] = 1000.0  # our clock stepped back: our own delta is now 100 s "ahead"
    replica = CursorLog(storage, keys, TOPIC, "c", 0, "A", clock=lambda: now[0], clock_skew_s=2.0)
    with caplog.at_level("WARNING", logger="bucketq.cursor"):
        await replica.load()
    assert replica.skew_seen == 100.0
    assert "ahead of ours" not in caplog.text
    late = CursorLog(storage, keys, TOPIC, "c", 0, "B", clock=lambda: 5000.0)
    await late.load()
    assert late.skew_seen == 0.0, "deltas stamped in our past are no lead at all"


async def test_checkpoints_are_written_every_n_deltas_exactly() -> None:
    storage = Storage(MemoryStore())
    keys = Keys()
    log = CursorLog(storage, keys, TOPIC, "c", 0, "W", checkpoint_every=3)
    await log.commit(lambda s: [Op("start", seq=0, base=0)])
    for _ in range(5):
        await log.commit(lambda s: [Op("seen", s.frontier + 1, count=1, base=s.frontier + 1)])
    await _settle_checkpoints(storage, keys, [3, 6])
    blob = await storage.get(keys.checkpoint(TOPIC, "c", 0, 6))
    assert blob is not None
    # the checkpoint is the state after its delta, in the deterministic compact form
    assert blob.data == json.dumps(log.state.to_json(), separators=(",", ":")).encode()


async def test_a_failed_checkpoint_write_is_not_fatal() -> None:
    faulty = FaultyStore(MemoryStore())
    storage = Storage(faulty)
    keys = Keys()
    log = CursorLog(storage, keys, TOPIC, "c", 0, "W", checkpoint_every=2)
    faulty.add(op="PUT", match="*/ckpt/*", kind="error", times=1)
    await log.commit(lambda s: [Op("start", seq=0, base=0)])
    await log.commit(lambda s: [Op("seen", 0, count=1, base=0)])
    await asyncio.sleep(0.05)
    assert faulty.injected["error"] == 1
    assert [i async for i in storage.list(keys.checkpoints_prefix(TOPIC, "c", 0))] == []
    assert (await CursorLog(storage, keys, TOPIC, "c", 0, "X").load()).n == 2


# -- fences (I1): the stored form, "only rises", and the trust window to the float step -----------


class FakeMonotonic:
    """Stands in for the ``time`` module inside ``core/fences.py``: a monotonic clock we set."""

    def __init__(self, now: float) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now


def test_fence_value_is_stored_in_the_documented_form() -> None:
    assert FenceValue(7, 70, 12.5).encode() == b'{"floor":7,"base":70,"at":12.5}'
    tombstone = FenceValue(7, 70, 12.5, deleted=True)
    assert tombstone.encode() == b'{"floor":7,"base":70,"at":12.5,"deleted":true}'
    assert FenceValue.decode(tombstone.encode()) == tombstone
    assert FenceValue.decode(b'{"floor":3}') == FenceValue(3, 0, 0.0, False), "a trim fence has only a floor"


async def test_read_fence_tells_missing_from_unreadable() -> None:
    storage = Storage(MemoryStore())
    assert await fences.read_fence(storage, "f.json") == (None, None)
    await storage.overwrite("f.json", FenceValue(4, 40).encode())
    value, modified = await fences.read_fence(storage, "f.json")
    blob = await storage.get("f.json")
    assert blob is not None and (value, modified) == (FenceValue(4, 40), blob.last_modified)
    for body in (b"not json", b'{"base": 1}', b'{"floor": "x"}', b"[3]"):
        await storage.overwrite("f.json", body)
        with pytest.raises(StorageError, match="unreadable"):
            await fences.read_fence(storage, "f.json")


async def test_raise_fence_only_raises_except_for_a_tombstone() -> None:
    storage = Storage(MemoryStore())

    async def stored() -> tuple[int, float, bool]:
        value, _ = await fences.read_fence(storage, "f.json")
        assert value is not None
        return value.floor, value.at, value.deleted

    assert await raise_fence(storage, "f.json", FenceValue(5)) is True
    assert await raise_fence(storage, "f.json", FenceValue(5, at=9.0)) is False, "equal is not higher"
    assert await raise_fence(storage, "f.json", FenceValue(4)) is False
    assert await stored() == (5, 0.0, False)
    assert await raise_fence(storage, "f.json", FenceValue(6)) is True
    assert await raise_fence(storage, "f.json", FenceValue(6, deleted=True)) is True, (
        "a topic deletion's tombstone"
    )
    assert await stored() == (6, 0.0, True)


async def test_fence_view_keeps_the_highest_floor_it_saw() -> None:
    storage = Storage(MemoryStore())
    view = fences.FenceView(storage, "f.json", trust_s=120.0)
    assert (view.floor, view.reads, view.trusted_at(0.0)) == (0, 0, False), "never read: never trusted"
    assert await view.refresh() == FenceValue(0) and view.reads == 1, "no fence: floor 0"
    await storage.overwrite("f.json", FenceValue(5).encode())
    await view.refresh()
    await storage.overwrite("f.json", FenceValue(3).encode())  # a stale replica of the store
    assert (await view.refresh()).floor == 5 and view.reads == 3
    await storage.overwrite("f.json", FenceValue(3, deleted=True).encode())
    assert await view.refresh() == FenceValue(3, deleted=True), "a tombstone is always taken"


async def test_fence_copy_is_trusted_for_strictly_less_than_trust_s(monkeypatch: pytest.MonkeyPatch) -> None:
    storage = Storage(MemoryStore())
    await storage.overwrite("f.json", FenceValue(5).encode())
    clock = FakeMonotonic(100.0)
    monkeypatch.setattr(fences, "time", clock)
    view = fences.FenceView(storage, "f.json", trust_s=120.0)
    await view.refresh()
    assert view.read_at == 100.0, "the copy's time is when the read started"
    assert view.trusted_at(math.nextafter(220.0, -math.inf))
    assert not view.trusted_at(220.0)
    # fresh(): re-read once the copy is half the trust window old, not before
    clock.now = math.nextafter(160.0, -math.inf)
    await view.fresh()
    assert view.reads == 1
    clock.now = 160.0
    await view.fresh()
    assert view.reads == 2 and view.read_at == 160.0


async def test_fence_admits_at_the_floor_and_rereads_an_old_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    storage = Storage(MemoryStore())
    await storage.overwrite("f.json", FenceValue(5).encode())
    monkeypatch.setattr(fences, "time", FakeMonotonic(100.0))
    view = fences.FenceView(storage, "f.json", trust_s=120.0)
    await view.refresh()
    assert await view.admits(5, completed_at=219.0)
    assert not await view.admits(4, completed_at=219.0)
    assert view.reads == 1, "a trusted copy decides alone"
    await storage.overwrite("f.json", FenceValue(8).encode())  # GC raised it meanwhile
    assert not await view.admits(7, completed_at=220.0), "too old a copy: read again, and 7 < 8"
    assert view.reads == 2
    assert await view.admits(8, completed_at=340.0)
    assert view.reads == 3


# -- segments: bounds on attempts and time, the head hint, orphans ---------------------------------


class ContendedOnce(MemoryStore):
    """A store whose first put-if-absent under ``match`` answers "being written by another
    writer" (csprng_verify's Contended) without writing."""

    def __init__(self, match: str) -> None:
        super().__init__()
        self.match = match
        self.contended = 0

    async def put(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        if if_none_match and self.match in key and not self.contended:
            self.contended += 1
            raise Contended(f"{key} is being created by another writer")
        return await super().put(key, data, if_none_match=if_none_match, if_match=if_match)


async def test_contended_segment_put_is_retried_not_acknowledged() -> None:
    store = ContendedOnce("/seg/")
    storage = Storage(store)
    keys = Keys()
    writer = SegmentWriter(storage, keys, TOPIC, 0, "w1")
    landed = await writer.append([line("a0")], "batch-a")
    assert store.contended == 1 and writer.conflicts == 0
    assert (landed.seq, landed.base) == (0, 0)
    assert await segment_at(storage, keys, 0) == ("batch-a", 0, ["a0"])


async def test_contended_delta_put_is_retried() -> None:
    store = ContendedOnce("/log/")
    storage = Storage(store)
    keys = Keys()
    log = CursorLog(storage, keys, TOPIC, "c", 0, "A")
    outcome = await log.commit(lambda s: [Op("start", seq=0, base=0)])
    assert store.contended == 1
    assert outcome is not None and (outcome.delta.n, outcome.results, outcome.conflicts) == (1, [True], 0)
    assert await storage.get(keys.delta(TOPIC, "c", 0, 1)) is not None


async def test_first_attempt_runs_even_with_no_time_left_and_the_second_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``timeout_s`` bounds retries, not the first try; a retry at exactly the deadline is late."""
    monkeypatch.setattr(segment_writer, "time", StillClock(NOW, monotonic=500.0))
    faulty = FaultyStore(MemoryStore())
    storage = Storage(faulty)
    writer = SegmentWriter(storage, Keys(), TOPIC, 0, "w1", timeout_s=0.0)
    assert (await writer.append([line("a0")], "batch-a")).seq == 0
    faulty.add(op="PUT", match="*/seg/*", kind="precondition", times=1)
    with pytest.raises(PublishTimeout, match="after 1 attempts"):
        await writer.append([line("b0")], "batch-b")


async def test_storage_error_past_the_deadline_is_a_publish_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """An error at exactly the deadline ends the publish at once (no backoff, no retry)."""
    clock = StillClock(NOW, monotonic=500.0)
    monkeypatch.setattr(segment_writer, "time", clock)
    faulty = FaultyStore(MemoryStore())
    storage = Storage(faulty)
    keys = Keys()
    writer = SegmentWriter(storage, keys, TOPIC, 0, "w1", timeout_s=0.0)
    faulty.add(op="PUT", match="*/seg/*", kind="error", times=1)
    with pytest.raises(PublishTimeout, match="not durable after 0s") as raised:
        await writer.append([line("a0")], "batch-a")
    assert isinstance(raised.value.__cause__, StorageError)
    assert await segment_numbers(storage, keys) == []
    assert faulty.injected["error"] == 1
    retrying = SegmentWriter(storage, keys, TOPIC, 0, "w2", timeout_s=30.0)
    faulty.add(op="PUT", match="*/seg/*", kind="error", times=1)
    assert (await retrying.append([line("a0")], "batch-a")).seq == 0, "within the time left: retried"


async def test_appended_reports_where_and_how_big_and_the_header_says_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(segment_writer, "time", StillClock(NOW))
    storage = Storage(MemoryStore())
    keys = Keys()
    writer = SegmentWriter(storage, keys, TOPIC, 3, "w1")
    await writer.append([line("a0"), line("a1")], "batch-a")
    landed = await writer.append([line("b0")], "batch-b")
    blob = await storage.get(keys.segment(TOPIC, 3, 1))
    assert blob is not None
    assert landed == segment_writer.Appended(1, 2, 1, len(blob.data))
    # the documented header (docs/protocol.md, Segments): no incarnation without a catalog
    assert json.loads(blob.data.split(b"\n", 1)[0]) == {
        "v": 1,
        "topic": TOPIC,
        "partition": 3,
        "seq": 1,
        "producer_id": "w1",
        "created_at": NOW,
        "count": 1,
        "base": 2,
        "batch": "batch-b",
    }


async def test_custom_encoder_gets_the_chosen_header() -> None:
    storage = Storage(MemoryStore())
    keys = Keys()
    writer = SegmentWriter(storage, keys, TOPIC, 0, "w1")
    headers: list[SegmentHeader] = []

    def encode(header: SegmentHeader) -> bytes:
        headers.append(header)
        return encode_segment(header, [line("pre0"), line("pre1")])

    landed = await writer.append([b"", b""], "batch-x", encode=encode)
    [header] = headers
    assert (header.seq, header.base, header.count, header.batch, header.producer_id) == (
        0,
        0,
        2,
        "batch-x",
        "w1",
    )
    assert (landed.seq, landed.count) == (0, 2)
    assert await segment_at(storage, keys, 0) == ("batch-x", 0, ["pre0", "pre1"])


async def test_head_hint_is_written_only_past_a_first_segment() -> None:
    faulty = FaultyStore(MemoryStore())
    storage = Storage(faulty)
    keys = Keys()
    writer = SegmentWriter(storage, keys, TOPIC, 0, "w1")
    await writer.write_head()  # no tail known yet
    writer.next_seq = 0
    await writer.write_head()  # an empty partition: nothing to hint
    assert await storage.get(keys.head(TOPIC, 0)) is None
    await writer.append([line("a0"), line("a1")], "batch-a")
    await writer.write_head()
    blob = await storage.get(keys.head(TOPIC, 0))
    assert blob is not None
    hint = json.loads(blob.data)
    assert (hint["seq"], hint["next_offset"]) == (0, 2)
    assert abs(hint["at"] - time.time()) < 60
    faulty.add(op="PUT", match="*/head.json", kind="error", times=1)
    await writer.write_head()  # advisory: an error is ignored
    assert faulty.injected["error"] == 1


async def test_put_into_a_freed_number_is_an_orphan_and_the_batch_lands_at_the_tail() -> None:
    """I1 without GC's real waits: the writer's cached tail (1) was freed by GC, which raised the
    floor to 3; its fence copy is too old to trust, so the successful PUT at 1 is checked again,
    rejected as an orphan, and the batch is written at the real tail."""
    storage = Storage(MemoryStore())
    keys = Keys()
    other = SegmentWriter(storage, keys, TOPIC, 0, "w2")
    for i in range(4):
        await other.append([line(f"x{i}")], f"batch-x{i}")
    await raise_fence(storage, keys.segment_floor(TOPIC, 0), FenceValue(3, base=3))
    await storage.delete([keys.segment(TOPIC, 0, n) for n in range(3)])
    stale = SegmentWriter(storage, keys, TOPIC, 0, "w1")
    stale.next_seq, stale.next_offset = 1, 1  # its view from before GC
    stale.fence.read_at = float("-inf")  # ... and its fence copy as old as can be

    landed = await stale.append([line("b0")], "batch-b")

    assert stale.orphans == 1 and stale.fence.floor == 3
    assert (landed.seq, landed.base) == (4, 4)
    assert await segment_at(storage, keys, 4) == ("batch-b", 4, ["b0"])
    assert await segment_numbers(storage, keys) == [1, 3, 4], "the orphan at 1 stays below the floor for GC"
    stale.next_seq, stale.next_offset = 2, 2  # stale once more
    stale.fence.read_at = float("-inf")
    assert (await stale.append([line("c0")], "batch-c")).seq == 5
    assert stale.orphans == 2


# -- hand-out rules at their boundaries (partition_worker, consumer) -------------------------------
#
# These modules read the wall clock (time.time) themselves: each test replaces the ``time`` the
# module sees with one that stands still (StillClock), so "exactly at the boundary" is reachable.


def worker_with(
    state: CursorState, records: dict[int, list[Record]], *, limit: int | None = None, **settings: object
) -> PartitionWorker:
    """A partition worker whose replica is ``state`` and whose window holds ``records``."""

    async def no_dead_letters(*_: object) -> None:
        raise AssertionError("not reached in these tests")

    worker = PartitionWorker(
        Storage(MemoryStore()),
        Keys(),
        TOPIC,
        "c",
        0,
        "me",
        ConsumerSettings.model_validate({"clock_skew_s": 2.0, "visibility_timeout_s": 30.0, **settings}),
        lambda: limit,
        no_dead_letters,
    )
    worker.log.state = state
    for seq, recs in records.items():
        header = SegmentHeader(TOPIC, 0, seq, len(recs), 0, "p", 0.0, f"b{seq}")
        worker._segments[seq] = Segment(header, recs)
    return worker


def cursor_with(count: int, ops: list[tuple[float, list[Op]]]) -> CursorState:
    """A started cursor that has seen one segment of ``count`` messages, then ``ops`` at their times."""
    state = CursorState()
    apply_delta(
        state, Delta(1, "m", "d1", 0.0, [Op("start", seq=0, base=0), Op("seen", 0, count=count, base=0)])
    )
    for at, batch in ops:
        apply_delta(state, Delta(state.n + 1, "m", f"d{state.n + 1}", at, batch))
    return state


def records(count: int, created_at: float = 0.0) -> list[Record]:
    return [Record(id=f"r{i}", created_at=created_at) for i in range(count)]


def test_expired_lease_is_claimed_only_past_the_clock_skew_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    """I4: a member claims an expired lease only when ``until + clock_skew_s < now``."""
    monkeypatch.setattr(partition_worker, "time", StillClock(NOW))
    state = cursor_with(
        3,
        [
            (
                900.0,
                [
                    Op("claim", 0, 0, token="a", member="x", until=NOW - 2.0),
                    Op("claim", 0, 1, token="b", member="x", until=math.nextafter(NOW - 2.0, 0)),
                ],
            )
        ],
    )
    worker = worker_with(state, {0: records(3)})
    claims, more = worker._choose_claims(state, 10, [])
    assert [c.pos for c in claims] == [(0, 1), (0, 2)], "(0,0) is expired, but within the margin"
    assert not more
    assert all(c.until == NOW + 30.0 and c.member == "me" and c.kind == "claim" for c in claims)
    assert len({c.token for c in claims}) == 2


def test_claims_respect_demand_priority_and_report_more(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partition_worker, "time", StillClock(NOW))
    state = cursor_with(4, [])
    recs = records(4)
    recs[3] = Record(id="urgent", priority=-1)
    worker = worker_with(state, {0: recs})
    claims, more = worker._choose_claims(state, 2, [])
    assert [c.pos for c in claims] == [(0, 3), (0, 0)], "lowest priority value first, then position"
    assert more
    claims, more = worker._choose_claims(state, 4, [])
    assert len(claims) == 4 and not more
    assert worker._choose_claims(state, 0, []) == ([], True), "no demand: only whether anything waits"


def test_a_message_at_its_delivery_limit_goes_to_the_janitor_not_to_a_claim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(partition_worker, "time", StillClock(NOW))
    state = cursor_with(
        3,
        [
            (
                900.0,
                [
                    Op("claim", 0, 0, token="a", member="x", until=950.0),
                    Op("release", 0, 0, token="a"),
                    Op("claim", 0, 1, token="b", member="x", until=950.0),
                    Op("release", 0, 1, token="b"),
                ],
            ),
            (901.0, [Op("claim", 0, 0, token="c", member="x", until=950.0), Op("release", 0, 0, token="c")]),
        ],
    )
    assert state.deliveries == {(0, 0): 2, (0, 1): 1}
    worker = worker_with(state, {0: records(3)}, limit=2)
    claims, _ = worker._choose_claims(state, 10, [])
    assert [c.pos for c in claims] == [(0, 1), (0, 2)]
    assert worker.dead_letter_candidates() == [((0, 0), 2)]
    assert worker_with(state, {0: records(3)}).dead_letter_candidates() == [], "no limit: no janitor"


def test_janitor_waits_for_a_last_lease_to_pass_the_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    """A message on its last allowed delivery is dead-lettered only once its lease is expired
    beyond the clock-skew margin (its holder may still be working on it before that)."""
    monkeypatch.setattr(partition_worker, "time", StillClock(NOW))
    state = cursor_with(
        2,
        [
            (
                900.0,
                [
                    Op("claim", 0, 0, token="a", member="x", until=NOW - 2.0),
                    Op("claim", 0, 1, token="b", member="x", until=math.nextafter(NOW - 2.0, 0)),
                ],
            )
        ],
    )
    worker = worker_with(state, {0: records(2)}, limit=1)
    assert worker.dead_letter_candidates() == [((0, 1), 1)]
    worker._dead_ready[(0, 1)] = "max_deliveries"
    assert worker.dead_letter_candidates() == [], "already on its way to the dead-letter topic"


def test_stealing_takes_messages_exactly_steal_after_old(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partition_worker, "time", StillClock(NOW))
    state = cursor_with(2, [])
    recs = [
        Record(id="old", created_at=NOW - 2.0),
        Record(id="young", created_at=math.nextafter(NOW - 2.0, math.inf)),
    ]
    worker = worker_with(state, {0: recs})
    claims, _ = worker._choose_claims(state, 10, [], min_age=2.0)
    assert [c.pos for c in claims] == [(0, 0)]
    claims, _ = worker._choose_claims(state, 10, [])
    assert [c.pos for c in claims] == [(0, 0), (0, 1)], "an owner does not wait"


def test_new_segment_delayed_until_now_is_claimable_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """Claims built in the same delta as the ``seen`` of a new segment apply the same rule as the
    cursor: a message is visible from its ``not_before`` on."""
    monkeypatch.setattr(partition_worker, "time", StillClock(NOW))
    state = cursor_with(1, [(900.0, [Op("claim", 0, 0, token="a", member="x", until=2000.0)])])
    header = SegmentHeader(TOPIC, 0, 1, 3, 1, "p", 0.0, "b1")
    new = Segment(
        header,
        [
            Record(id="due", not_before=NOW),
            Record(id="later", not_before=math.nextafter(NOW, math.inf)),
            Record(id="skipped"),
        ],
    )
    worker = worker_with(state, {0: records(1)})
    worker._discovered.append(new)
    seen = Op("seen", 1, count=3, base=1, delayed={0: NOW, 1: math.nextafter(NOW, math.inf)}, skip=[2])
    claims, _ = worker._choose_claims(state, 10, [seen])
    assert [c.pos for c in claims] == [(1, 0)]
    assert state.claimable((1, 0), NOW) is False, "(the state has not seen it yet)"


async def test_poll_hands_out_only_with_more_than_the_margin_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """I4: a prefetched message is handed out only with more than ``min(0.5 s, visibility/10)`` of
    its durable lease left; at exactly the margin it is dropped (another member may claim it)."""
    bq = Bucketq.builder().memory().build(store=MemoryStore())
    await bq.open()
    try:
        await bq.create_topic(TOPIC)
        consumer = await bq.register_consumer("c", TOPIC, visibility_timeout_s=2.0)
        now = time.time()
        margin = 0.2  # min(0.5, 2.0 / 10)
        at_receipt, past_receipt = (
            Receipt(TOPIC, 0, 0, 0, "ta").encode(),
            Receipt(TOPIC, 0, 0, 1, "tb").encode(),
        )
        at_margin = Message(TOPIC, 0, 0, 0, 0, Record(id="at"), at_receipt, 1, now + margin)
        past_margin = Message(
            TOPIC, 0, 0, 1, 1, Record(id="past"), past_receipt, 1, math.nextafter(now + margin, math.inf)
        )
        consumer._buffer.extend([at_margin, past_margin])
        monkeypatch.setattr(consumer_module, "time", StillClock(now))
        got = await consumer.poll(10, 0)  # the buffer is not empty: nothing is awaited
        monkeypatch.undo()
        assert [m.id for m in got] == ["past"]
        assert list(consumer._held) == [past_receipt]
    finally:
        await bq.close()


# -- I3: judging a landed delta's ops from a later state (the delta itself was collected) ----------


def held_state() -> CursorState:
    """Position (0,0) leased with token "t" until 1030, (0,1) done, (0,2) free."""
    return cursor_with(
        3,
        [
            (
                1000.0,
                [
                    Op("claim", 0, 0, token="t", member="A", until=1030.0),
                    Op("claim", 0, 1, token="u", member="A", until=1030.0),
                    Op("ack", 0, 1, token="u"),
                ],
            )
        ],
    )


@pytest.mark.parametrize(
    ("op", "held"),
    [
        (Op("claim", 0, 0, token="t", until=1030.0), True),
        (Op("claim", 0, 0, token="t", until=math.nextafter(1030.0, 0)), True),
        (
            Op("claim", 0, 0, token="t", until=math.nextafter(1030.0, math.inf)),
            False,
        ),  # a later extend is not ours
        (Op("claim", 0, 0, token="other", until=1030.0), False),
        (Op("claim", 0, 2, token="t", until=1030.0), False),
        (Op("extend", 0, 0, token="t", until=1030.0), True),
        (Op("extend", 0, 0, token="t"), True),
        (Op("extend", 0, 0, token="other", until=1.0), False),
        (Op("ack", 0, 1, token="u"), True),
        (Op("ack", 0, 0, token="t"), False),
        (Op("dead", 0, 1, reason="x"), True),
        (Op("dead", 0, 2, reason="x"), False),
        (Op("release", 0, 2, token="v"), True),
        (Op("release", 0, 0, token="other"), True),
        (Op("release", 0, 0, token="t"), False),
        (Op("seen", 1, count=1), True),
    ],
    ids=lambda v: v.kind if isinstance(v, Op) else str(v),
)
def test_held_judges_each_op_conservatively(op: Op, held: bool) -> None:
    assert cursor_log._held(held_state(), op) is held


async def test_segment_header_carries_the_topic_incarnation() -> None:
    """I6: with a catalog, the writer binds to the live marker's incarnation and writes it into
    the header, so readers of a re-created topic can tell its segments from a fenced writer's."""
    bq = Bucketq.builder().memory().build(store=MemoryStore())
    await bq.open()
    try:
        await bq.create_topic(TOPIC)
        marker = await bq.catalog.marker(TOPIC)
        assert marker.incarnation
        writer = SegmentWriter(bq.storage, bq.keys, TOPIC, 0, "w1", catalog=bq.catalog)
        await writer.append([line("a0")], "batch-a")
        blob = await bq.storage.get(bq.keys.segment(TOPIC, 0, 0))
        assert blob is not None and json.loads(blob.data.split(b"\n", 1)[0])["inc"] == marker.incarnation
        assert writer.incarnation == marker.incarnation
    finally:
        await bq.close()


async def test_resolved_delta_at_a_checkpoint_number_writes_the_checkpoint() -> None:
    faulty = FaultyStore(MemoryStore())
    storage = Storage(faulty)
    keys = Keys()
    log = CursorLog(storage, keys, TOPIC, "c", 0, "A", max_attempts=1, checkpoint_every=2)
    await log.commit(lambda s: [Op("start", seq=0, base=0)])
    faulty.add(op="PUT", match="*/log/*", kind="drop_after_write", times=1)
    with pytest.raises(StorageError):
        await log.commit(lambda s: [Op("seen", 0, count=1, base=0)])
    outcome = await log.commit(lambda s: [])
    assert outcome is not None and (outcome.delta.n, outcome.results, outcome.conflicts) == (2, [True], 0)
    await _settle_checkpoints(storage, keys, [2])


async def test_catch_up_via_checkpoint_on_an_up_to_date_replica_costs_one_get() -> None:
    """Only a checkpoint *above* the tip is worth loading: an up-to-date replica lists, finds
    none, and GETs the next delta number once."""
    store = MemoryStore()
    storage = Storage(store)
    keys = Keys()
    log = CursorLog(storage, keys, TOPIC, "c", 0, "W", checkpoint_every=4)
    await log.commit(lambda s: [Op("start", seq=0, base=0)])
    for _ in range(5):
        await log.commit(lambda s: [Op("seen", s.frontier + 1, count=1, base=s.frontier + 1)])
    await _settle_checkpoints(storage, keys, [4])
    gets = store.stats.requests["GET"]
    assert await log.catch_up(via_checkpoint=True) == 0
    assert store.stats.requests["GET"] - gets == 1
    assert log.state.n == 6


async def test_background_checkpoint_task_is_held_until_done() -> None:
    """The event loop keeps only weak references to tasks: the checkpoint write is held in a set
    until it is done (else it may be collected before it runs), and let go then (else it leaks)."""
    storage = Storage(MemoryStore())
    keys = Keys()
    log = CursorLog(storage, keys, TOPIC, "c", 0, "W", checkpoint_every=2)
    await log.commit(lambda s: [Op("start", seq=0, base=0)])
    held_before = set(cursor_log._background)
    await log.commit(lambda s: [Op("seen", 0, count=1, base=0)])
    pending = cursor_log._background - held_before
    assert len(pending) == 1
    await asyncio.gather(*pending)
    await asyncio.sleep(0)  # done callbacks run on the next turn
    assert not pending & cursor_log._background
    await _settle_checkpoints(storage, keys, [2])


async def test_replica_one_delta_below_the_fence_reloads_instead_of_reading_there() -> None:
    """I2 at its boundary: a replica at ``n`` with ``n + 1 < floor`` would read a number GC may
    have freed (a 404 there looks like the tip, an orphan there is not part of the log): it
    reloads from the newest checkpoint instead. Here n = 3, floor = 5, delta 4 collected."""
    storage = Storage(MemoryStore())
    keys = Keys()
    writer = CursorLog(storage, keys, TOPIC, "c", 0, "W", checkpoint_every=4)
    await writer.commit(lambda s: [Op("start", seq=0, base=0)])
    replica = CursorLog(storage, keys, TOPIC, "c", 0, "R")
    for _ in range(2):
        await writer.commit(lambda s: [Op("seen", s.frontier + 1, count=1, base=s.frontier + 1)])
    await replica.load()
    assert replica.state.n == 3
    for _ in range(3):
        await writer.commit(lambda s: [Op("seen", s.frontier + 1, count=1, base=s.frontier + 1)])
    await _settle_checkpoints(storage, keys, [4])
    await raise_fence(storage, keys.log_trim(TOPIC, "c", 0), FenceValue(5))
    await storage.delete([keys.delta(TOPIC, "c", 0, n) for n in range(1, 5)])
    replica.fence.read_at = float("-inf")  # its copy of the fence is too old to trust

    await replica.catch_up()

    assert replica.state.n == 6 and replica.reloads == 2
    assert replica.state.to_json() == writer.state.to_json()
