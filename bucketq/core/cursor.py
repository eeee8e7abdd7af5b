"""Cursor state of one subscription partition: a pure function of its delta log (docs/design.md 2.3).

``apply_delta(state, delta)`` validates each op against the state *as it is when the op is
reached* and applies the valid ones. Every reader runs the same rules on the same log, so all
members converge on the same state. Invalid ops are skipped (the writer learns which by the
result list). Nothing here performs I/O.

Op kinds are the closed vocabulary :data:`OpKind` (docs/protocol.md, "Cursor logs"). An op
whose kind this version does not know is dropped when its delta is decoded
(:meth:`Delta.from_json` lists it in :attr:`Delta.unknown_ops`, and the cursor log warns): it is
invalid for this version, exactly as an op that fails its rule, so every replica of this version
still converges on the same state. A new op kind needs a new bucket format, which older
processes refuse (docs/protocol.md: format 3 added ``seek``, format 6 ``stand``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast, get_args

Pos = tuple[int, int]  # (segment seq, index in segment)

OpKind = Literal["start", "seen", "expire", "seek", "claim", "extend", "ack", "release", "dead", "stand"]
"""The ops of a cursor delta, as written in its ``"op"`` field."""

OP_KINDS: Final[frozenset[str]] = frozenset(get_args(OpKind))


class UnknownOpKind(ValueError):
    """A delta op names a kind this version does not know (see the module docstring)."""

    def __init__(self, kind: object) -> None:
        super().__init__(f"unknown cursor op kind {kind!r}: expected one of {', '.join(get_args(OpKind))}")
        self.kind = kind


def op_kind(value: object) -> OpKind:
    """``value`` as an :data:`OpKind`; raises :class:`UnknownOpKind` for anything else."""
    if not isinstance(value, str) or value not in OP_KINDS:
        raise UnknownOpKind(value)
    return cast(OpKind, value)


@dataclass(slots=True)
class Lease:
    token: str
    member: str
    until: float
    deliveries: int


@dataclass(slots=True)
class Standing:
    """A standing claim (format 6, I20): ``member`` holds every message of the segments numbered
    ``[seq, seq + count)``, under ``token``, until ``until`` (docs/protocol.md "Standing claims")."""

    token: str
    member: str
    seq: int
    count: int
    until: float
    # the segments it leased at ``seen``, as inclusive ranges: a segment seen again after a
    # ``seek`` back is never covered twice (its first delivery carried this token: the same
    # receipt would be handed out twice), while one a seek forward passed over unseen still is
    # (its holder may have handed it out before the seek)
    leased: list[list[int]] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.seq + self.count

    def covers(self, seq: int) -> bool:
        """Whether a ``seen`` of segment ``seq`` now leases its messages to the holder."""
        return self.seq <= seq < self.end and not self.leased_at_seen(seq)

    def leased_at_seen(self, seq: int) -> bool:
        return any(lo <= seq <= hi for lo, hi in self.leased)

    def lease(self, seq: int) -> None:
        """Segment ``seq`` was leased at ``seen`` (never again under this standing claim)."""
        if self.leased and self.leased[-1][1] == seq - 1:
            self.leased[-1][1] = seq  # the usual case: segments are seen in order
        else:
            self.leased = _merged([*self.leased, [seq, seq]])


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
    """One delta op (docs/protocol.md, "Cursor logs" lists each kind's fields)."""

    kind: OpKind
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

    def __post_init__(self) -> None:
        op_kind(self.kind)  # an op of an unknown kind is never built, let alone written

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
        if k in ("expire", "seek"):
            return {"op": k, "seq": self.seq, "base": self.base}
        if k == "stand":
            return {
                "op": k,
                "seq": self.seq,
                "count": self.count,
                "token": self.token,
                "member": self.member,
                "until": self.until,
            }
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
        """Decode one op. A malformed field raises ``KeyError``/``TypeError``/``ValueError``; a
        well-formed op of a kind not in :data:`OpKind` raises :class:`UnknownOpKind`."""
        delayed = obj.get("delayed")
        return cls(
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
            kind=op_kind(obj["op"]),  # last: a malformed op is malformed whatever its kind
        )


@dataclass(slots=True)
class Delta:
    """One entry of the cursor log: ``log/{n}``.

    ``unknown_ops`` is set only on a decoded delta: the kinds of the ops it held that this
    version does not know, dropped from ``ops`` (never written back: a delta is only written by
    the member that built its ops).
    """

    n: int
    member: str
    id: str
    at: float
    ops: list[Op]
    unknown_ops: list[str] = field(default_factory=list, compare=False, repr=False)
    # the topic incarnation its writer wrote for (format 4; "" when the writer named none: a
    # format-3 delta, or a tool without a topic fence). A replica of another incarnation never
    # applies it (I6): the delta takes its number with no ops, like an undecodable one.
    inc: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "v": 1,
            "n": self.n,
            "member": self.member,
            "id": self.id,
            "at": self.at,
            "ops": [op.to_json() for op in self.ops],
        }
        if self.inc:
            out["inc"] = self.inc
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Delta:
        """Decode a delta. Ops of an unknown kind are dropped and named in ``unknown_ops``
        (forward compatibility, see the module docstring); any other malformed field raises
        ``KeyError``/``TypeError``/``ValueError``."""
        ops: list[Op] = []
        unknown: list[str] = []
        for o in obj.get("ops", []):
            try:
                ops.append(Op.from_json(o))
            except UnknownOpKind as exc:
                unknown.append(str(exc.kind))
        return cls(
            n=int(obj["n"]),
            member=str(obj.get("member", "")),
            id=str(obj.get("id", "")),
            at=float(obj["at"]),
            ops=ops,
            unknown_ops=unknown,
            inc=str(obj.get("inc") or ""),
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
    # the standing claim (format 6, I20; None: none), and the ranges ``(seq, end)`` of standing
    # claims that ended without being given back, whose segments the log has not all seen: their
    # holder may have delivered those messages before writing ``seen``
    standing: Standing | None = None
    suspect: list[tuple[int, int]] = field(default_factory=list)

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
            # format 6, only when there is one: a checkpoint of a log without standing claims keeps
            # the bytes it had
            **(
                {"stand": [st.token, st.member, st.seq, st.count, st.until, st.leased]}
                if (st := self.standing) is not None
                else {}
            ),
            **({"suspect": [[lo, hi] for lo, hi in self.suspect]} if self.suspect else {}),
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
            standing=(
                Standing(
                    str(st[0]),
                    str(st[1]),
                    int(st[2]),
                    int(st[3]),
                    float(st[4]),
                    [[int(lo), int(hi)] for lo, hi in st[5]],
                )
                if (st := obj.get("stand"))
                else None
            ),
            suspect=[(int(lo), int(hi)) for lo, hi in obj.get("suspect", [])],
        )


def _ranges(values: Iterable[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for v in sorted(values):
        if out and out[-1][1] == v - 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return out


def _merged(ranges: list[list[int]]) -> list[list[int]]:
    """Inclusive ranges sorted, with adjacent and overlapping ones joined."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
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

    Invariant (I3): each delta is applied exactly once, in log order. Callers never apply a
    delta twice: CursorLog resolves a write of unknown outcome through ``state.ids`` instead of
    re-applying (a mismatched number is a bug, hence ValueError). After: ``state.n = delta.n``
    and ``ids`` records the member's newest delta id, forgetting members silent for longer than
    ``MEMBER_ID_TTL_S``.
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
    """Validate one op at the writer's clock ``at`` and apply it when valid.

    Invariant: an invalid op leaves ``state`` untouched (validation is a pure function of the
    state and ``at``, so every replica judges it the same way). Every :data:`OpKind` has a rule;
    ops of unknown kinds never get here (:class:`Op` refuses to build one).
    """
    return _HANDLERS[op.kind](state, op, at)


def _start(state: CursorState, op: Op, at: float) -> bool:
    """``start``: where the subscription begins in this partition (I5).

    Before: the cursor has not started (a second ``start`` is invalid: the first one in the log
    wins, so members racing to start agree). After: ``started``, ``floor = seq`` with offset
    ``base``, an empty window (``frontier = seq - 1``). Recording the start in the log makes it
    part of the state every member reads, and lets GC see every subscription's floor.
    """
    if state.started:
        return False
    state.started = True
    state.floor = op.seq
    state.floor_offset = op.base
    state.frontier = op.seq - 1
    return True


def _seen(state: CursorState, op: Op, at: float) -> bool:
    """``seen``: a discovered segment enters the window.

    Before: started, and ``seq == frontier + 1`` (the window grows one segment at a time, in
    order, so no segment is skipped or entered twice); ``count > 0``, or ``count == 0`` with
    ``corrupt`` (a segment that cannot be decoded enters as an empty one, so one bad object never
    stalls the partition, I8). After: ``frontier = seq``; the segment's delayed messages and the
    ones it skips (redrives for another consumer, segments of another incarnation or hidden by a
    transaction) come from the immutable segment, so every replica validates claims identically
    without reading segments; the floor advances past complete segments.
    """
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
    _cover(state, op.seq, seg)
    _advance_floor(state)
    return True


def _cover(state: CursorState, seq: int, seg: SegmentState) -> None:
    """A segment just seen, in the range of the standing claim or of ones that ended unrenewed
    (I20): each of its messages that is neither delayed nor done (skipped) is leased to the
    standing claim's holder, until its ``until`` (past or not: what the holder handed out before
    ``seen`` was written is counted and runs out as a lease), and counts one prior delivery for
    each ended range holding it. A lease kept across a ``seek`` stays as it is."""
    suspected = sum(1 for lo, hi in state.suspect if lo <= seq < hi)
    state.suspect = [(lo, hi) for lo, hi in state.suspect if hi > state.frontier + 1]
    st = state.standing
    covered = st is not None and st.covers(seq)
    if not covered and not suspected:
        return
    if covered:
        assert st is not None
        st.lease(seq)
    for idx in range(seg.count):
        pos = (seq, idx)
        if idx in seg.done or pos in state.delayed or pos in state.leases:
            continue
        if st is None or not covered:
            state.deliveries[pos] = state.deliveries.get(pos, 0) + suspected
            continue
        assert st is not None
        deliveries = state.deliveries.pop(pos, 0) + suspected + 1
        state.leases[pos] = Lease(st.token, st.member, st.until, deliveries)
        state.counters.delivered += 1
        if deliveries > 1:
            state.counters.redelivered += 1


def _expire(state: CursorState, op: Op, at: float) -> bool:
    """``expire``: GC collected segments below ``seq`` before this subscription read them (it
    started, or fell, below the partition's floor fence; I5).

    Before: started, ``seq > floor`` and ``base >= floor_offset`` (the floor only moves
    forward). After: ``floor = seq`` with offset ``base``; segments, leases, delivery counts and
    delays below it are dropped, and every message skipped that was not done is counted in
    ``collected`` (never lost silently). The frontier never moves back.
    """
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


def _seek(state: CursorState, op: Op, at: float) -> bool:
    """``seek`` (format 3): an operator moved the subscription to segment ``seq`` (offset
    ``base``): back, to deliver messages again, or forward, to skip them.

    Before: started, ``seq >= 0`` and ``base >= 0``. After: the window starts afresh at ``seq``
    (``floor = seq``, ``frontier = seq - 1``, no segment known: ``seen`` ops rebuild it from the
    immutable segments, so every replica agrees); delays and delivery counts go, except those of
    live leases. **Leases are kept** until they are settled or run out: a member that has not read
    the seek yet may still be working on its message, and a position it holds is not claimable
    by anyone else meanwhile (I4: no lease is ever shared). Settling a kept lease whose segment
    is not in the new window drops the lease without marking anything done (after a seek back,
    that message is delivered again: at least once). Not-done messages a seek forward passes
    over (offsets between the old window and ``base``) are counted in ``skipped``.
    """
    if not state.started or op.seq < 0 or op.base < 0:
        return False
    if op.base > state.floor_offset:
        done = sum(len(seg.done) for seq, seg in state.segments.items() if seq < op.seq)
        known_end = max(state.end_offset, state.floor_offset)
        state.counters.skipped += max(0, min(op.base, known_end) - state.floor_offset - done) + max(
            0, op.base - known_end
        )
    state.segments.clear()
    state.deliveries = {pos: n for pos, n in state.deliveries.items() if pos in state.leases}
    state.delayed.clear()
    state.floor = op.seq
    state.floor_offset = op.base
    state.frontier = op.seq - 1
    return True


def _claim(state: CursorState, op: Op, at: float) -> bool:
    """``claim``: a member takes the lease on one message (I4).

    Before: the op has a token and an ``until``; the position is in the window, not done, not
    delayed past ``at``, and holds no lease with ``until >= at`` (validators use only the
    writer's clock; the clock-skew margin is applied by the member before it claims, so replicas
    with different settings never disagree). After: the lease is ``(token, member, until)``, its
    delivery count is one more than before (an expired lease taken over counts in ``expired``,
    a delivery after the first in ``redelivered``), and the position is no longer delayed.
    """
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
    """The lease ``op`` names by its token, if it is still the position's lease (even past its
    ``until``: a lease nobody reclaimed is still its holder's)."""
    lease = state.leases.get(op.pos)
    if lease is None or op.token is None or lease.token != op.token:
        return None
    return lease


def _extend(state: CursorState, op: Op, at: float) -> bool:
    """``extend``: the lease holder moves its deadline.

    Before: the op's token is the position's current lease and the op has an ``until``. After:
    the lease's ``until`` is the op's (a member hands a message out only against a committed
    deadline, I4).
    """
    lease = _current(state, op)
    if lease is None or op.until is None:
        return False
    lease.until = float(op.until)
    return True


def _ack(state: CursorState, op: Op, at: float) -> bool:
    """``ack``: the lease holder marks the message done.

    Before: the op's token is the position's current lease (valid even after ``until`` if nobody
    reclaimed it; a stale token is invalid, so a message redelivered elsewhere is settled only by
    its new holder). After: the position is done (lease, delivery count and delay dropped) and
    the floor advances past complete segments.
    """
    if _current(state, op) is None:
        return False
    _mark_done(state, op.pos)
    state.counters.acked += 1
    return True


def _release(state: CursorState, op: Op, at: float) -> bool:
    """``release``: the lease holder gives the message back (a nack, or a drain).

    Before: the op's token is the position's current lease. After: no lease; the delivery count
    is kept for the next claim (``counted=False``, a prefetched message the app never saw, takes
    its delivery back); a ``not_before`` after ``at`` delays the message until then.
    """
    lease = _current(state, op)
    if lease is None:
        return False
    pos = op.pos
    del state.leases[pos]
    state.counters.released += 1
    if not op.counted:
        state.counters.delivered -= 1
    if pos[0] < state.floor:  # a lease kept across a seek forward: the message is done already
        return True
    deliveries = lease.deliveries if op.counted else lease.deliveries - 1
    if deliveries > 0:
        state.deliveries[pos] = deliveries
    if op.not_before is not None and op.not_before > at:
        state.delayed[pos] = float(op.not_before)
    return True


def _dead(state: CursorState, op: Op, at: float) -> bool:
    """``dead``: the message is dead-lettered and done.

    Before: with a token, it is the position's current lease (the holder's nack without
    requeue); without one (the janitor's max-deliveries), the position is in the window, not
    done, and holds no live lease at ``at``. After: the position is done, counted in ``dead``,
    and the floor advances past complete segments.
    """
    pos = op.pos
    if op.token is not None:
        if _current(state, op) is None:
            return False
    elif not state.in_window(pos) or state.is_done(pos) or state.live_lease(pos, at) is not None:
        return False
    _mark_done(state, pos)
    state.counters.dead += 1
    return True


def _stand(state: CursorState, op: Op, at: float) -> bool:
    """``stand`` (format 6, I20): a member takes, renews or ends a standing claim.

    **Take** (a token that is not the standing claim's): started, a token and an ``until``,
    ``count > 0``, ``seq >= frontier + 1`` (only segments not seen yet, so no covered message can
    be claimed already), and no standing claim with ``until >= at``. A standing claim that ran out
    unrenewed leaves its range suspect (its holder may have handed out messages whose ``seen`` it
    never wrote). **Renew** (its token and holder, the same ``seq``): ``until`` and ``count``
    become the op's, even past ``until`` if nobody took a new one (as ``extend``); leases already
    given are not moved. **End** (its token and holder, ``count == 0``): the partition is given
    back; nothing is suspect (the holder wrote ``seen`` for what it handed out first).
    """
    if not state.started or op.token is None or op.count < 0:
        return False
    current = state.standing
    if current is not None and current.token == op.token:
        if (op.member or "") != current.member or op.seq != current.seq:
            return False
        if op.count == 0:
            state.standing = None
            return True
        if op.until is None:
            return False
        current.until = float(op.until)
        current.count = op.count
        return True
    if op.until is None or op.count == 0 or op.seq < state.frontier + 1:
        return False
    if current is not None:
        if current.until >= at:
            return False
        if current.end > state.frontier + 1:
            state.suspect.append((max(current.seq, state.frontier + 1), current.end))
    state.standing = Standing(op.token, op.member or "", op.seq, op.count, float(op.until))
    return True


def _mark_done(state: CursorState, pos: Pos) -> None:
    """The position is done: no lease, delivery count or delay remains for it, and the floor
    advances past the segments that became complete. A position outside the window (a lease
    kept across a ``seek``) only loses its lease: below the floor it is done already, above the
    frontier it is delivered again once its segment is seen."""
    state.leases.pop(pos, None)
    state.deliveries.pop(pos, None)
    state.delayed.pop(pos, None)
    seg = state.segments.get(pos[0])
    if seg is None:
        return
    seg.done.add(pos[1])
    _advance_floor(state)


def _advance_floor(state: CursorState) -> None:
    """Invariant after every rule: the segment at ``floor`` is not complete (or not seen yet).
    Complete segments at the floor leave the window, and ``floor_offset`` follows them, so the
    window holds only segments with work left and everything below the floor is done."""
    while True:
        seg = state.segments.get(state.floor)
        if seg is None or not seg.complete:
            return
        del state.segments[state.floor]
        state.floor_offset = seg.base + seg.count
        state.floor += 1


_HANDLERS: dict[OpKind, Callable[[CursorState, Op, float], bool]] = {
    "start": _start,
    "seen": _seen,
    "expire": _expire,
    "seek": _seek,
    "claim": _claim,
    "extend": _extend,
    "ack": _ack,
    "release": _release,
    "dead": _dead,
    "stand": _stand,
}
