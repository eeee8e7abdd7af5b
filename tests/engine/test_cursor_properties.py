"""Property tests: several members interleave commits on one cursor log (docs/design.md section 3).

A hypothesis state machine drives members with deliberately stale replicas, so commits race
(412 → rebase). After every step it replays the whole log through an independent reference
model and checks: never two live leases on one message, no acked message claimed again,
exact counts, and every member's replica converging on the same state.
"""

from __future__ import annotations

import asyncio
import copy
import json
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from bucketq.config import Settings
from bucketq.core.cursor import CursorState, Delta, Op, apply_delta
from bucketq.core.cursor_log import CursorLog
from bucketq.core.ids import token
from bucketq.core.keys import Keys
from bucketq.storage import open_storage
from bucketq.storage.memory import MemoryStore

MEMBERS = 3
VISIBILITY = 10.0


@dataclass
class RefLease:
    token: str
    until: float
    deliveries: int


@dataclass
class Reference:
    """A deliberately naive model of the rules, to check apply() against."""

    counts: dict[int, int] = field(default_factory=dict)
    done: set[tuple[int, int]] = field(default_factory=set)
    leases: dict[tuple[int, int], RefLease] = field(default_factory=dict)
    released: dict[tuple[int, int], int] = field(default_factory=dict)
    delayed: dict[tuple[int, int], float] = field(default_factory=dict)
    started: bool = False
    claims_accepted: int = 0
    acks_accepted: int = 0

    def step(self, op: Op, at: float) -> bool:
        pos = (op.seq, op.idx)
        if op.kind == "start":
            if self.started:
                return False
            self.started = True
            return True
        if op.kind == "seen":
            if op.seq != len(self.counts):
                return False
            self.counts[op.seq] = op.count
            return True
        valid_pos = op.seq in self.counts and 0 <= op.idx < self.counts[op.seq]
        lease = self.leases.get(pos)
        current = lease is not None and lease.token == op.token
        if op.kind == "claim":
            if not valid_pos or pos in self.done or (lease is not None and lease.until >= at):
                return False
            if self.delayed.get(pos, 0) > at:
                return False
            prior = lease.deliveries if lease else self.released.pop(pos, 0)
            assert op.token is not None and op.until is not None
            self.leases[pos] = RefLease(op.token, op.until, prior + 1)
            self.delayed.pop(pos, None)
            self.claims_accepted += 1
            return True
        if op.kind == "extend":
            if not current:
                return False
            assert lease is not None and op.until is not None
            lease.until = op.until
            return True
        if op.kind == "ack":
            if not current:
                return False
            del self.leases[pos]
            self.done.add(pos)
            self.acks_accepted += 1
            return True
        if op.kind == "release":
            if not current:
                return False
            assert lease is not None
            del self.leases[pos]
            self.released[pos] = lease.deliveries
            if op.not_before:
                self.delayed[pos] = op.not_before
            return True
        return False


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class CursorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = Clock()
        self.keys = Keys("")
        self.store = MemoryStore()
        self.storage = self.run(
            open_storage(
                Settings.from_dict({"backend": "memory", "strategy": "conditional_write"}), store=self.store
            )
        )
        self.members = [
            CursorLog(self.storage, self.keys, "t", "c", 0, f"m{i}", checkpoint_every=4, clock=self.clock)
            for i in range(MEMBERS)
        ]
        self.held: list[dict[tuple[int, int], str]] = [{} for _ in range(MEMBERS)]
        self.acked: set[tuple[int, int]] = set()
        self.segments = 0

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.loop.close()

    @initialize()
    def start(self) -> None:
        self.run(self.members[0].commit(lambda s: [] if s.started else [Op("start", seq=0, base=0)]))

    @rule(member=st.integers(0, MEMBERS - 1), count=st.integers(1, 4))
    def publish_segment(self, member: int, count: int) -> None:
        seq = self.segments

        def build(state: CursorState) -> list[Op]:
            return [Op("seen", seq=seq, count=count, base=0)] if state.frontier < seq else []

        self.run(self.members[member].commit(build))
        self.segments += 1

    @rule(member=st.integers(0, MEMBERS - 1), want=st.integers(1, 3))
    def claim(self, member: int, want: int) -> None:
        now = self.clock.now

        def build(state: CursorState) -> list[Op]:
            picks = [p for p in state.open_positions() if state.claimable(p, now)][:want]
            return [
                Op("claim", s, i, token=token(), member=f"m{member}", until=now + VISIBILITY)
                for s, i in picks
            ]

        outcome = self.run(self.members[member].commit(build))
        if outcome is None:
            return
        for op, ok in zip(outcome.delta.ops, outcome.results, strict=True):
            if ok:
                assert op.pos not in self.acked, f"acked message {op.pos} was claimed again"
                assert op.token is not None
                self.held[member][op.pos] = op.token

    @precondition(lambda self: any(self.held))
    @rule(
        member=st.integers(0, MEMBERS - 1), kind=st.sampled_from(["ack", "release", "extend"]), data=st.data()
    )
    def settle(self, member: int, kind: str, data: st.DataObject) -> None:
        if not self.held[member]:
            return
        pos = data.draw(st.sampled_from(sorted(self.held[member])))
        tok = self.held[member][pos]
        op = Op(kind, pos[0], pos[1], token=tok, until=self.clock.now + VISIBILITY)
        outcome = self.run(self.members[member].commit(lambda s: [op]))
        assert outcome is not None
        ok = outcome.results[-1]
        if kind != "extend":
            del self.held[member][pos]
        if ok and kind == "ack":
            assert pos not in self.acked, f"{pos} acked twice"
            self.acked.add(pos)

    # VISIBILITY itself (and 5 + 5) lands a claim exactly on a lease's ``until``, where the lease
    # is still live: the boundary a flipped comparison would get wrong
    @rule(seconds=st.sampled_from([1.0, 5.0, VISIBILITY, VISIBILITY + 1]))
    def tick(self, seconds: float) -> None:
        self.clock.now += seconds

    @invariant()
    def log_matches_reference_and_members_converge(self) -> None:
        ref = Reference()
        replay = CursorState()
        n = 1
        while True:
            blob = self.store._objects.get(self.keys.delta("t", "c", 0, n))
            if blob is None:
                break
            delta = Delta.from_json(json.loads(blob.data))
            expected = [ref.step(op, delta.at) for op in delta.ops]
            results = apply_delta(replay, delta)
            assert results == expected, f"delta {n}: apply {results} != reference {expected}"
            n += 1
        # exact counts
        assert replay.counters.acked == ref.acks_accepted == len(self.acked)
        assert replay.counters.delivered == ref.claims_accepted
        total = sum(ref.counts.values())
        done = len(ref.done)
        assert replay.pending == total - done
        assert set(replay.leases) == set(ref.leases)
        # convergence: every member that catches up holds exactly the replayed state
        # (on copies: the members themselves stay stale, so their next commits race)
        for member in self.members:
            probe = CursorLog(self.storage, self.keys, "t", "c", 0, "probe")
            probe.state = copy.deepcopy(member.state)
            self.run(probe.catch_up())
            assert probe.state.to_json() == replay.to_json()
        # a fresh reader loading from the newest checkpoint also converges
        fresh = CursorLog(self.storage, self.keys, "t", "c", 0, "reader")
        self.run(fresh.load())
        assert fresh.state.to_json() == replay.to_json()


TestCursorMachine = CursorMachine.TestCase
# Examples, steps and randomness come from the loaded profile (tests/conftest.py: `ci` is
# derandomised, `soak` is large and random); only the health check stays local: every step
# replays the whole log, which is slow by design.
TestCursorMachine.settings = settings(suppress_health_check=[HealthCheck.too_slow])
