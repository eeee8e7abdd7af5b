"""Cursor state of one subscription partition: a pure function of its delta log (DESIGN.md 2.3).

``apply_delta(state, delta)`` validates each op against the state *as it is when the op is
reached* and applies the valid ones. Every reader runs the same rules on the same log, so all
members converge on the same state. Invalid ops are skipped (the writer learns which by the
result list). Nothing here performs I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

Pos = tuple[int, int]  # (segment seq, index in segment)


@dataclass(slots=True)
class Lease:
    token: str
    member: str
    until: float
    deliveries: int


@dataclass(slots=True)
class SegmentState:
    count: int
    base: int
    done: set[int] = field(default_factory=set)

    @property
    def complete(self) -> bool:
        return len(self.done) >= self.count


@dataclass(slots=True)
class Counters:
    delivered: int = 0
    redelivered: int = 0
    expired: int = 0
    acked: int = 0
    released: int = 0
    dead: int = 0
    skipped: int = 0
    collected: int = 0  # messages GC collected before this subscription read them (``expire``)
    corrupt: int = 0  # segments that could not be decoded (``seen`` with ``corrupt``)


@dataclass(slots=True)
class Op:
    """One delta op. ``kind`` is one of start, seen, expire, claim, extend, ack, release, dead."""

    kind: str
    seq: int = 0
    idx: int = 0
    token: str | None = None
    member: str | None = None
    until: float | None = None
    not_before: float | None = None
    counted: bool = True
    reason: str | None = None
    count: int = 0
    base: int = 0
    delayed: dict[int, float] | None = None
    skip: list[int] | None = None
    corrupt: bool = False
    ref: Any = field(default=None, compare=False, repr=False)  # the writer's bookkeeping, not stored

    @property
    def pos(self) -> Pos:
        return (self.seq, self.idx)

    def to_json(self) -> dict[str, Any]:
        k = self.kind
        if k == "start":
            return {"op": k, "seq": self.seq, "base": self.base}
        if k == "seen":
            out: dict[str, Any] = {"op": k, "seq": self.seq, "count": self.count, "base": self.base}
            if self.delayed:
                out["delayed"] = {str(i): t for i, t in self.delayed.items()}
            if self.skip:
                out["skip"] = self.skip
            if self.corrupt:
                out["corrupt"] = True
            return out
        if k == "expire":
            return {"op": k, "seq": self.seq, "base": self.base}
        out = {"op": k, "seq": self.seq, "idx": self.idx}
        if self.token is not None:
            out["token"] = self.token
        if k == "claim":
            out["member"] = self.member
        if k in ("claim", "extend"):
            out["until"] = self.until
        if k == "release":
            out["not_before"] = self.not_before
            if not self.counted:
                out["counted"] = False
        if k == "dead":
            out["reason"] = self.reason
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Op:
        delayed = obj.get("delayed")
        return cls(
            kind=obj["op"],
            seq=int(obj.get("seq", 0)),
            idx=int(obj.get("idx", 0)),
            token=obj.get("token"),
            member=obj.get("member"),
            until=obj.get("until"),
            not_before=obj.get("not_before"),
            counted=bool(obj.get("counted", True)),
            reason=obj.get("reason"),
            count=int(obj.get("count", 0)),
            base=int(obj.get("base", 0)),
            delayed={int(i): float(t) for i, t in delayed.items()} if delayed else None,
            skip=[int(i) for i in obj["skip"]] if obj.get("skip") else None,
            corrupt=bool(obj.get("corrupt", False)),
        )


@dataclass(slots=True)
class Delta:
    """One entry of the cursor log: ``log/{n}``."""

    n: int
    member: str
    id: str
    at: float
    ops: list[Op]

    def to_json(self) -> dict[str, Any]:
        return {
            "v": 1,
            "n": self.n,
            "member": self.member,
            "id": self.id,
            "at": self.at,
            "ops": [op.to_json() for op in self.ops],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Delta:
        return cls(
            n=int(obj["n"]),
            member=str(obj.get("member", "")),
            id=str(obj.get("id", "")),
            at=float(obj["at"]),
            ops=[Op.from_json(o) for o in obj.get("ops", [])],
        )


@dataclass(slots=True)
class CursorState:
    """The state after ``n`` deltas. Segments ``[floor, frontier]`` are the open window."""

    n: int = 0
    started: bool = False
    floor: int = 0
    floor_offset: int = 0
    frontier: int = -1
    segments: dict[int, SegmentState] = field(default_factory=dict)
    leases: dict[Pos, Lease] = field(default_factory=dict)
    deliveries: dict[Pos, int] = field(default_factory=dict)
    delayed: dict[Pos, float] = field(default_factory=dict)
    counters: Counters = field(default_factory=Counters)
    # member -> (id, at) of the newest delta it wrote: a member whose write outcome was unknown
    # learns from any later state (even one loaded from a checkpoint) whether its delta landed.
    ids: dict[str, tuple[str, float]] = field(default_factory=dict)

    # -- queries ---------------------------------------------------------------------------------

    def is_done(self, pos: Pos) -> bool:
        seq, idx = pos
        if seq < self.floor:
            return True
        seg = self.segments.get(seq)
        return seg is not None and idx in seg.done

    def in_window(self, pos: Pos) -> bool:
        seq, idx = pos
        seg = self.segments.get(seq)
        return seg is not None and 0 <= idx < seg.count

    def live_lease(self, pos: Pos, now: float) -> Lease | None:
        lease = self.leases.get(pos)
        if lease is not None and lease.until >= now:
            return lease
        return None

    def prior_deliveries(self, pos: Pos) -> int:
        lease = self.leases.get(pos)
        return lease.deliveries if lease is not None else self.deliveries.get(pos, 0)

    def claimable(self, pos: Pos, now: float) -> bool:
        """Whether a claim written at ``now`` would be valid."""
        if not self.started or not self.in_window(pos) or self.is_done(pos):
            return False
        nb = self.delayed.get(pos)
        if nb is not None and nb > now:
            return False
        return self.live_lease(pos, now) is None

    def open_positions(self) -> Iterator[Pos]:
        """Positions in the window that are not done, in order."""
        for seq in sorted(self.segments):
            seg = self.segments[seq]
            if seg.complete:
                continue
            for idx in range(seg.count):
                if idx not in seg.done:
                    yield (seq, idx)

    @property
    def end_offset(self) -> int:
        """Partition offset just past the last seen segment."""
        if self.frontier < self.floor:
            return self.floor_offset
        last = self.segments[self.frontier]
        return last.base + last.count

    @property
    def pending(self) -> int:
        """Messages seen but not done (visible, delayed or leased)."""
        return sum(seg.count - len(seg.done) for seg in self.segments.values())

    # -- serialisation (checkpoints) ------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "v": 1,
            "n": self.n,
            "started": self.started,
            "floor": self.floor,
            "floor_offset": self.floor_offset,
            "frontier": self.frontier,
            "segments": {
                str(seq): {"count": s.count, "base": s.base, "done": _ranges(s.done)}
                for seq, s in sorted(self.segments.items())
            },
            "leases": [
                [seq, idx, le.token, le.member, le.until, le.deliveries]
                for (seq, idx), le in sorted(self.leases.items())
            ],
            "deliveries": [[seq, idx, d] for (seq, idx), d in sorted(self.deliveries.items())],
            "delayed": [[seq, idx, t] for (seq, idx), t in sorted(self.delayed.items())],
            "counters": {name: getattr(self.counters, name) for name in Counters.__dataclass_fields__},
            "ids": [[member, i, at] for member, (i, at) in sorted(self.ids.items())],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CursorState:
        return cls(
            n=int(obj["n"]),
            started=bool(obj["started"]),
            floor=int(obj["floor"]),
            floor_offset=int(obj["floor_offset"]),
            frontier=int(obj["frontier"]),
            segments={
                int(seq): SegmentState(int(s["count"]), int(s["base"]), _unranges(s["done"]))
                for seq, s in obj["segments"].items()
            },
            leases={
                (int(seq), int(idx)): Lease(tok, mem, float(until), int(d))
                for seq, idx, tok, mem, until, d in obj["leases"]
            },
            deliveries={(int(s), int(i)): int(d) for s, i, d in obj["deliveries"]},
            delayed={(int(s), int(i)): float(t) for s, i, t in obj["delayed"]},
            counters=Counters(**obj.get("counters", {})),
            ids={str(m): (str(i), float(at)) for m, i, at in obj.get("ids", [])},
        )


def _ranges(values: Iterable[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for v in sorted(values):
        if out and out[-1][1] == v - 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return out


def _unranges(ranges: list[list[int]]) -> set[int]:
    out: set[int] = set()
    for lo, hi in ranges:
        out.update(range(int(lo), int(hi) + 1))
    return out


# -- the rules ----------------------------------------------------------------------------------


# How long a member's newest delta id is remembered: a member silent for longer cannot tell
# whether its last write landed (it treats it as lost; its ops are validated again, never twice).
MEMBER_ID_TTL_S = 24 * 3600.0


def apply_delta(state: CursorState, delta: Delta) -> list[bool]:
    """Apply ``delta`` (which must be number ``state.n + 1``) in place; return each op's validity.

    Callers never apply a delta twice: CursorLog resolves a write of unknown outcome through
    ``state.ids`` instead of re-applying (a mismatched number is a bug, hence ValueError).
    """
    if delta.n != state.n + 1:
        raise ValueError(f"delta {delta.n} applied to state at {state.n}")
    results = [apply_op(state, op, delta.at) for op in delta.ops]
    state.n = delta.n
    if delta.member:
        state.ids[delta.member] = (delta.id, delta.at)
        horizon = delta.at - MEMBER_ID_TTL_S
        for member in [m for m, (_, at) in state.ids.items() if at < horizon]:
            del state.ids[member]
    return results


def apply_op(state: CursorState, op: Op, at: float) -> bool:
    """Validate one op at the writer's clock ``at`` and apply it when valid."""
    handler = _HANDLERS.get(op.kind)
    if handler is None:
        return False
    return handler(state, op, at)


def _start(state: CursorState, op: Op, at: float) -> bool:
    if state.started:
        return False
    state.started = True
    state.floor = op.seq
    state.floor_offset = op.base
    state.frontier = op.seq - 1
    return True


def _seen(state: CursorState, op: Op, at: float) -> bool:
    """Invariant: the window grows one segment at a time, in order (``seq == frontier + 1``); a
    corrupt segment enters as an empty one so that one bad object never stalls the partition."""
    if not state.started or op.seq != state.frontier + 1:
        return False
    if op.corrupt:
        if op.count != 0:
            return False
        state.counters.corrupt += 1
    elif op.count <= 0:
        return False
    seg = SegmentState(op.count, op.base)
    state.segments[op.seq] = seg
    state.frontier = op.seq
    for idx, nb in (op.delayed or {}).items():
        if 0 <= idx < op.count:
            state.delayed[(op.seq, idx)] = nb
    for idx in op.skip or ():
        if 0 <= idx < op.count:
            seg.done.add(idx)
            state.counters.skipped += 1
    _advance_floor(state)
    return True


def _expire(state: CursorState, op: Op, at: float) -> bool:
    """GC collected segments below ``seq`` before this subscription read them (it started, or
    fell, below the partition's floor fence). Invariant: only moves the floor forward; every
    message skipped is counted in ``collected``."""
    if not state.started or op.seq <= state.floor or op.base < state.floor_offset:
        return False
    done = sum(len(seg.done) for seq, seg in state.segments.items() if seq < op.seq)
    known_end = max(state.end_offset, state.floor_offset)
    state.counters.collected += max(0, min(op.base, known_end) - state.floor_offset - done) + max(
        0, op.base - known_end
    )
    for seq in [s for s in state.segments if s < op.seq]:
        del state.segments[seq]
    for table in (state.leases, state.deliveries, state.delayed):
        for pos in [p for p in table if p[0] < op.seq]:
            del table[pos]
    state.floor = op.seq
    state.floor_offset = op.base
    state.frontier = max(state.frontier, op.seq - 1)
    _advance_floor(state)
    return True


def _claim(state: CursorState, op: Op, at: float) -> bool:
    pos = op.pos
    if op.token is None or op.until is None or not state.claimable(pos, at):
        return False
    previous = state.leases.get(pos)
    if previous is not None:
        state.counters.expired += 1
    deliveries = state.prior_deliveries(pos) + 1
    state.deliveries.pop(pos, None)
    state.delayed.pop(pos, None)
    state.leases[pos] = Lease(op.token, op.member or "", float(op.until), deliveries)
    state.counters.delivered += 1
    if deliveries > 1:
        state.counters.redelivered += 1
    return True


def _current(state: CursorState, op: Op) -> Lease | None:
    lease = state.leases.get(op.pos)
    if lease is None or op.token is None or lease.token != op.token:
        return None
    return lease


def _extend(state: CursorState, op: Op, at: float) -> bool:
    lease = _current(state, op)
    if lease is None or op.until is None:
        return False
    lease.until = float(op.until)
    return True


def _ack(state: CursorState, op: Op, at: float) -> bool:
    if _current(state, op) is None:
        return False
    _mark_done(state, op.pos)
    state.counters.acked += 1
    return True


def _release(state: CursorState, op: Op, at: float) -> bool:
    lease = _current(state, op)
    if lease is None:
        return False
    pos = op.pos
    del state.leases[pos]
    deliveries = lease.deliveries if op.counted else lease.deliveries - 1
    if deliveries > 0:
        state.deliveries[pos] = deliveries
    if not op.counted:
        state.counters.delivered -= 1
    if op.not_before is not None and op.not_before > at:
        state.delayed[pos] = float(op.not_before)
    state.counters.released += 1
    return True


def _dead(state: CursorState, op: Op, at: float) -> bool:
    pos = op.pos
    if op.token is not None:
        if _current(state, op) is None:
            return False
    elif not state.in_window(pos) or state.is_done(pos) or state.live_lease(pos, at) is not None:
        return False
    _mark_done(state, pos)
    state.counters.dead += 1
    return True


def _mark_done(state: CursorState, pos: Pos) -> None:
    state.leases.pop(pos, None)
    state.deliveries.pop(pos, None)
    state.delayed.pop(pos, None)
    state.segments[pos[0]].done.add(pos[1])
    _advance_floor(state)


def _advance_floor(state: CursorState) -> None:
    while True:
        seg = state.segments.get(state.floor)
        if seg is None or not seg.complete:
            return
        del state.segments[state.floor]
        state.floor_offset = seg.base + seg.count
        state.floor += 1


_HANDLERS = {
    "start": _start,
    "seen": _seen,
    "expire": _expire,
    "claim": _claim,
    "extend": _extend,
    "ack": _ack,
    "release": _release,
    "dead": _dead,
}
