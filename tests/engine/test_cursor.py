"""The cursor rules (docs/design.md 2.3) as pure functions: each op's validity and effect."""

from __future__ import annotations

import json
import math

import pytest

from bucketq.core.cursor import (
    MEMBER_ID_TTL_S,
    Counters,
    CursorState,
    Delta,
    Op,
    UnknownOpKind,
    apply_delta,
)

T0 = 1_000_000.0


def started(*segments: int, floor: int = 0) -> CursorState:
    """A state that has seen segments with the given message counts, starting at ``floor``."""
    state = CursorState()
    ops = [Op("start", seq=floor, base=0)]
    base = 0
    for i, count in enumerate(segments):
        ops.append(Op("seen", seq=floor + i, count=count, base=base))
        base += count
    apply(state, ops)
    return state


def apply(state: CursorState, ops: list[Op], at: float = T0) -> list[bool]:
    return apply_delta(state, Delta(state.n + 1, "m", "id", at, ops))


def claim(seq: int, idx: int, tok: str, until: float = T0 + 30, member: str = "m1") -> Op:
    return Op("claim", seq, idx, token=tok, member=member, until=until)


def test_start_only_once_and_sets_window() -> None:
    state = CursorState()
    assert apply(state, [Op("start", seq=5, base=50), Op("start", seq=0, base=0)]) == [True, False]
    assert (state.floor, state.frontier, state.floor_offset) == (5, 4, 50)


def test_seen_must_be_contiguous() -> None:
    state = started(floor=0)
    results = apply(
        state, [Op("seen", seq=1, count=3), Op("seen", seq=0, count=2), Op("seen", seq=0, count=2)]
    )
    assert results == [False, True, False]
    assert state.frontier == 0
    assert state.end_offset == 2


def test_claim_then_second_claim_rejected_while_live() -> None:
    state = started(3)
    assert apply(state, [claim(0, 0, "a"), claim(0, 0, "b")]) == [True, False]
    assert state.leases[(0, 0)].token == "a"
    assert state.leases[(0, 0)].deliveries == 1


def test_claim_outside_window_or_done_rejected() -> None:
    state = started(2)
    assert apply(state, [claim(0, 2, "x"), claim(1, 0, "y")]) == [False, False]
    apply(state, [claim(0, 0, "a"), Op("ack", 0, 0, token="a")])
    assert apply(state, [claim(0, 0, "b")]) == [False]


def test_expired_lease_can_be_reclaimed_and_counts_redelivery() -> None:
    state = started(1)
    apply(state, [claim(0, 0, "a", until=T0 + 10)])
    assert apply(state, [claim(0, 0, "b", until=T0 + 40)], at=T0 + 5) == [False]
    assert apply(state, [claim(0, 0, "b", until=T0 + 40)], at=T0 + 11) == [True]
    lease = state.leases[(0, 0)]
    assert (lease.token, lease.deliveries) == ("b", 2)
    assert state.counters.redelivered == 1
    assert state.counters.expired == 1


def test_stale_token_cannot_ack_extend_or_release() -> None:
    state = started(1)
    apply(state, [claim(0, 0, "a", until=T0 + 10)])
    apply(state, [claim(0, 0, "b", until=T0 + 40)], at=T0 + 11)
    results = apply(
        state,
        [
            Op("ack", 0, 0, token="a"),
            Op("extend", 0, 0, token="a", until=T0 + 99),
            Op("release", 0, 0, token="a"),
        ],
        at=T0 + 12,
    )
    assert results == [False, False, False]
    assert state.leases[(0, 0)].token == "b"
    assert not state.is_done((0, 0))


def test_ack_is_valid_after_expiry_if_nobody_reclaimed() -> None:
    state = started(1)
    apply(state, [claim(0, 0, "a", until=T0 + 10)])
    assert apply(state, [Op("ack", 0, 0, token="a")], at=T0 + 100) == [True]
    assert state.is_done((0, 0))


def test_extend_moves_deadline() -> None:
    state = started(1)
    apply(state, [claim(0, 0, "a", until=T0 + 10), Op("extend", 0, 0, token="a", until=T0 + 60)])
    assert apply(state, [claim(0, 0, "b")], at=T0 + 30) == [False]


def test_release_with_delay_hides_until_not_before() -> None:
    state = started(1)
    apply(state, [claim(0, 0, "a"), Op("release", 0, 0, token="a", not_before=T0 + 20)])
    assert state.deliveries[(0, 0)] == 1
    assert apply(state, [claim(0, 0, "b")], at=T0 + 10) == [False]
    assert apply(state, [claim(0, 0, "b", until=T0 + 60)], at=T0 + 21) == [True]
    assert state.leases[(0, 0)].deliveries == 2


def test_uncounted_release_gives_back_the_delivery() -> None:
    state = started(1)
    apply(state, [claim(0, 0, "a"), Op("release", 0, 0, token="a", counted=False)])
    assert (0, 0) not in state.deliveries
    apply(state, [claim(0, 0, "b")])
    assert state.leases[(0, 0)].deliveries == 1


def test_dead_with_token_or_without_live_lease() -> None:
    state = started(3)
    apply(state, [claim(0, 0, "a", until=T0 + 10), claim(0, 1, "b", until=T0 + 10)])
    results = apply(
        state,
        [
            Op("dead", 0, 0, token="a", reason="nack"),
            Op("dead", 0, 1, reason="max"),
            Op("dead", 0, 2, reason="max"),
        ],
        at=T0 + 5,
    )
    assert results == [True, False, True]  # (0,1) has a live lease held by someone else
    assert apply(state, [Op("dead", 0, 1, reason="max")], at=T0 + 11) == [True]
    assert state.counters.dead == 3
    assert state.floor == 1


def test_floor_advances_over_completed_segments_only_in_order() -> None:
    state = started(1, 2)
    apply(state, [claim(1, 0, "x"), claim(1, 1, "y"), Op("ack", 1, 0, token="x"), Op("ack", 1, 1, token="y")])
    assert state.floor == 0  # segment 0 still open
    apply(state, [claim(0, 0, "z"), Op("ack", 0, 0, token="z")])
    assert state.floor == 2
    assert state.floor_offset == 3
    assert state.segments == {}


def test_seen_with_skip_and_delay() -> None:
    state = started()
    apply(state, [Op("seen", seq=0, count=3, base=0, delayed={1: T0 + 50}, skip=[2])])
    assert state.is_done((0, 2))
    assert not state.claimable((0, 1), T0)
    assert state.claimable((0, 1), T0 + 51)
    assert state.counters.skipped == 1


def test_an_op_of_unknown_kind_is_never_built() -> None:
    with pytest.raises(UnknownOpKind, match="frobnicate"):
        Op("frobnicate", 0, 0)  # type: ignore[arg-type]
    with pytest.raises(UnknownOpKind):
        Op.from_json({"op": "frobnicate", "seq": 0, "idx": 0})


def test_unknown_op_read_from_the_log_is_flagged_and_skipped_not_fatal() -> None:
    """Forward compatibility: a delta holding an op this version does not know keeps its other
    ops; the unknown one is dropped (invalid for every replica of this version alike) and named."""
    state = started(1)
    raw = {
        "v": 1,
        "n": state.n + 1,
        "member": "m",
        "id": "id",
        "at": T0,
        "ops": [{"op": "frobnicate", "seq": 0, "idx": 0}, claim(0, 0, "t").to_json()],
    }
    delta = Delta.from_json(json.loads(json.dumps(raw)))
    assert delta.unknown_ops == ["frobnicate"]
    assert [op.kind for op in delta.ops] == ["claim"]
    assert apply_delta(state, delta) == [True]
    assert state.leases[(0, 0)].token == "t"


def test_delta_out_of_order_is_an_error() -> None:
    state = started(1)
    with pytest.raises(ValueError, match="applied to state"):
        apply_delta(state, Delta(state.n + 2, "m", "id", T0, []))


def test_state_and_delta_round_trip_through_json() -> None:
    state = started(3, 2)
    apply(
        state,
        [
            claim(0, 0, "a"),
            claim(0, 1, "b"),
            Op("ack", 0, 1, token="b"),
            Op("release", 0, 0, token="a", not_before=T0 + 9),
        ],
    )
    again = CursorState.from_json(json.loads(json.dumps(state.to_json())))
    assert again == state
    delta = Delta(
        7, "m", "x", T0, [Op("seen", seq=3, count=2, base=9, delayed={0: 1.5}, skip=[1]), claim(0, 0, "t")]
    )
    assert Delta.from_json(json.loads(json.dumps(delta.to_json()))).to_json() == delta.to_json()


# -- exact boundaries: every time comparison in the rules, at equality and one float step past ----
#
# Floats next to a boundary are built with math.nextafter, so "just past" is the smallest step a
# clock can take: a comparison flipped between < and <= (or > and >=) fails one of these.


def after(t: float) -> float:
    return math.nextafter(t, math.inf)


def before(t: float) -> float:
    return math.nextafter(t, -math.inf)


def test_lease_is_live_at_its_until_and_claimable_just_after() -> None:
    """I4 / docs/protocol.md: a claim is valid only with no lease with ``until >= at``."""
    state = started(1)
    apply(state, [claim(0, 0, "a", until=T0 + 10)])
    assert state.live_lease((0, 0), T0 + 10) is not None
    assert state.live_lease((0, 0), after(T0 + 10)) is None
    assert not state.claimable((0, 0), T0 + 10)
    assert state.claimable((0, 0), after(T0 + 10))
    assert apply(state, [claim(0, 0, "b", until=T0 + 40)], at=T0 + 10) == [False]
    assert apply(state, [claim(0, 0, "b", until=T0 + 40)], at=after(T0 + 10)) == [True]
    assert state.leases[(0, 0)].token == "b"


def test_dead_without_token_respects_a_lease_live_at_its_until() -> None:
    state = started(1)
    apply(state, [claim(0, 0, "a", until=T0 + 10)])
    assert apply(state, [Op("dead", 0, 0, reason="max")], at=T0 + 10) == [False]
    assert apply(state, [Op("dead", 0, 0, reason="max")], at=after(T0 + 10)) == [True]
    assert state.is_done((0, 0))


def test_delayed_message_is_claimable_exactly_at_not_before() -> None:
    state = started()
    apply(state, [Op("seen", seq=0, count=1, base=0, delayed={0: T0 + 50})])
    assert not state.claimable((0, 0), before(T0 + 50))
    assert state.claimable((0, 0), T0 + 50)
    assert apply(state, [claim(0, 0, "a", until=T0 + 80)], at=before(T0 + 50)) == [False]
    assert apply(state, [claim(0, 0, "a", until=T0 + 80)], at=T0 + 50) == [True]
    assert (0, 0) not in state.delayed, "a claim consumes the delay"


def test_release_not_before_equal_to_at_is_no_delay() -> None:
    """``not_before`` delays only when it lies after the release's ``at``; at ``at`` itself the
    message is visible at once (and nothing is kept in ``delayed``)."""
    state = started(2)
    apply(state, [claim(0, 0, "a"), claim(0, 1, "b")])
    results = apply(
        state,
        [
            Op("release", 0, 0, token="a", not_before=T0 + 5),
            Op("release", 0, 1, token="b", not_before=after(T0 + 5)),
        ],
        at=T0 + 5,
    )
    assert results == [True, True]
    assert (0, 0) not in state.delayed
    assert state.claimable((0, 0), T0 + 5)
    assert state.delayed[(0, 1)] == after(T0 + 5)
    assert not state.claimable((0, 1), T0 + 5)
    assert state.claimable((0, 1), after(T0 + 5))


def test_release_not_before_in_the_past_is_no_delay() -> None:
    state = started(1)
    apply(state, [claim(0, 0, "a"), Op("release", 0, 0, token="a", not_before=T0 - 100)])
    assert state.delayed == {}
    assert state.claimable((0, 0), T0)


def test_member_ids_are_kept_exactly_for_the_ttl() -> None:
    """A member's newest delta id survives ``MEMBER_ID_TTL_S`` of silence (I3: it can still learn
    whether its last write landed), and is forgotten one step later."""
    state = started(1)
    apply_delta(state, Delta(state.n + 1, "old", "id-old", T0, []))
    apply_delta(state, Delta(state.n + 1, "new", "id-1", T0 + MEMBER_ID_TTL_S, []))
    assert state.ids["old"] == ("id-old", T0)
    apply_delta(state, Delta(state.n + 1, "new", "id-2", after(T0 + MEMBER_ID_TTL_S), []))
    assert "old" not in state.ids
    assert state.ids["new"] == ("id-2", after(T0 + MEMBER_ID_TTL_S))


def test_delta_without_member_records_no_id() -> None:
    state = started(1)
    before_ids = dict(state.ids)
    apply_delta(state, Delta(state.n + 1, "", "anonymous", T0 + 2 * MEMBER_ID_TTL_S, []))
    assert state.ids == before_ids, "an anonymous delta neither records nor expires ids"


def test_expire_bounds_seq_above_floor_and_base_not_below_floor_offset() -> None:
    """``expire`` is valid only when started, ``seq > floor`` and ``base >= floor_offset``: the
    floor only moves forward."""
    state = CursorState()
    assert apply(state, [Op("expire", seq=6, base=50)]) == [False], "not started"
    apply(state, [Op("start", seq=5, base=50)])
    results = apply(
        state, [Op("expire", seq=5, base=60), Op("expire", seq=6, base=49), Op("expire", seq=6, base=50)]
    )
    assert results == [False, False, True]
    assert (state.floor, state.floor_offset, state.frontier, state.end_offset) == (6, 50, 5, 50)
    assert state.counters.collected == 0, "nothing lay between the old and the new floor"


def test_expire_counts_exactly_what_it_skips_and_keeps_the_segment_at_seq() -> None:
    """Only segments below ``seq`` go, with their leases, deliveries and delays; every message
    skipped that was not done is counted in ``collected`` (I5)."""
    state = started(2, 3)  # seq 0: offsets 0-1, seq 1: offsets 2-4
    apply(
        state,
        [
            claim(0, 0, "a"),
            Op("ack", 0, 0, token="a"),
            claim(0, 1, "b"),
            claim(1, 0, "c"),
            Op("ack", 1, 0, token="c"),
            claim(1, 1, "d"),
            claim(1, 2, "e"),
            Op("release", 1, 2, token="e", not_before=T0 + 60),
        ],
    )
    assert apply(state, [Op("expire", seq=1, base=2)]) == [True]
    assert state.counters.collected == 1, "(0,1) was leased, not done: one message collected"
    assert set(state.segments) == {1} and state.segments[1].done == {0}
    assert (
        set(state.leases) == {(1, 1)} and set(state.deliveries) == {(1, 2)} and set(state.delayed) == {(1, 2)}
    )
    assert (state.floor, state.floor_offset, state.frontier) == (1, 2, 1)
    # past the frontier: the unseen offsets 5-8 count too, and everything below goes
    assert apply(state, [Op("expire", seq=4, base=9)]) == [True]
    assert state.counters.collected == 1 + 2 + 4
    assert (state.segments, state.leases, state.deliveries, state.delayed) == ({}, {}, {}, {})
    assert (state.floor, state.floor_offset, state.frontier, state.end_offset) == (4, 9, 3, 9)
    assert apply(state, [Op("seen", seq=4, count=1, base=9)]) == [True], "the window goes on at the new floor"


def test_expire_onto_a_complete_segment_moves_the_floor_past_it() -> None:
    state = started(1, 1)
    apply(state, [claim(1, 0, "a"), Op("ack", 1, 0, token="a")])
    assert state.floor == 0
    assert apply(state, [Op("expire", seq=1, base=1)]) == [True]
    assert (state.floor, state.floor_offset, state.segments) == (2, 2, {})


def test_seen_keeps_only_delays_and_skips_inside_the_segment() -> None:
    state = started()
    op = Op("seen", seq=0, count=2, base=0, delayed={-1: T0 + 9, 1: T0 + 9, 2: T0 + 9}, skip=[-1, 0, 2])
    assert apply(state, [op]) == [True]
    assert state.delayed == {(0, 1): T0 + 9}
    assert state.segments[0].done == {0}
    assert state.counters.skipped == 1


def test_seen_count_and_corrupt_rules() -> None:
    state = started()
    results = apply(
        state,
        [
            Op("seen", seq=0, count=0),
            Op("seen", seq=0, count=-1),
            Op("seen", seq=0, count=1, corrupt=True),
            Op("seen", seq=0, count=0, corrupt=True),
        ],
    )
    assert results == [False, False, False, True]
    assert state.counters.corrupt == 1
    assert (state.floor, state.frontier, state.segments) == (1, 0, {}), "an empty segment is complete at once"
    assert apply(
        state,
        [
            Op("seen", seq=1, count=0, corrupt=True),
            Op("seen", seq=2, count=3, skip=[0, 2]),
            Op("seen", seq=3, count=1, base=0),
        ],
    ) == [True, True, True]
    assert (state.counters.corrupt, state.counters.skipped) == (2, 2)
    assert apply(CursorState(), [Op("seen", seq=0, count=1)]) == [False], "not started"


def test_window_and_done_bounds() -> None:
    state = started(2, floor=5)
    assert state.is_done((4, 0)), "below the floor is done"
    assert not state.is_done((5, 0)) and not state.is_done((6, 0))
    assert state.in_window((5, 0)) and state.in_window((5, 1))
    assert not state.in_window((5, 2)) and not state.in_window((5, -1)) and not state.in_window((6, 0))
    assert apply(state, [claim(5, -1, "a"), claim(5, 2, "b"), claim(4, 0, "c")]) == [False, False, False]


def test_claim_needs_a_token_and_a_deadline() -> None:
    state = started(1)
    no_token = Op("claim", 0, 0, member="m1", until=T0 + 30)
    no_until = Op("claim", 0, 0, token="a", member="m1")
    assert apply(state, [no_token, no_until]) == [False, False]
    assert state.leases == {} and state.counters.delivered == 0


def test_first_claim_is_no_redelivery_and_records_the_member() -> None:
    state = started(1)
    apply(state, [claim(0, 0, "a", member="m7")])
    assert state.leases[(0, 0)].member == "m7"
    assert (state.counters.delivered, state.counters.redelivered, state.counters.expired) == (1, 0, 0)


def test_extend_needs_the_token_and_a_deadline() -> None:
    state = started(1)
    apply(state, [claim(0, 0, "a", until=T0 + 10)])
    results = apply(
        state,
        [
            Op("extend", 0, 0, token="a"),
            Op("extend", 0, 0, until=T0 + 99),
            Op("extend", 1, 0, token="a", until=T0 + 99),
        ],
    )
    assert results == [False, False, False]
    assert state.leases[(0, 0)].until == T0 + 10


def test_counted_release_keeps_the_delivery_count_and_counts_released() -> None:
    state = started(1)
    apply(state, [claim(0, 0, "a"), Op("release", 0, 0, token="a")])
    assert state.deliveries == {(0, 0): 1}
    assert (state.counters.delivered, state.counters.released) == (1, 1)
    apply(state, [claim(0, 0, "b"), Op("release", 0, 0, token="b", counted=False)])
    assert state.deliveries == {(0, 0): 1}, "the uncounted second delivery is given back"
    assert (state.counters.delivered, state.counters.released, state.counters.redelivered) == (1, 2, 1)


def test_ack_and_dead_clear_every_trace_of_the_position() -> None:
    state = started(3)
    apply(state, [claim(0, 0, "a"), Op("release", 0, 0, token="a", not_before=T0 + 5)])
    apply(state, [claim(0, 0, "b", until=T0 + 40), Op("ack", 0, 0, token="b")], at=T0 + 5)
    apply(
        state,
        [
            claim(0, 1, "c"),
            Op("release", 0, 1, token="c", not_before=T0 + 500),
            Op("dead", 0, 1, reason="max"),
        ],
    )
    assert (state.leases, state.deliveries, state.delayed) == ({}, {}, {})
    assert state.segments[0].done == {0, 1}
    assert (state.counters.acked, state.counters.dead) == (1, 1)
    assert apply(state, [Op("dead", 0, 1, reason="again"), Op("dead", 0, 3, reason="outside")]) == [
        False,
        False,
    ]


def test_delta_and_state_json_are_the_documented_format() -> None:
    """The delta and checkpoint bytes are the protocol (docs/protocol.md): every writer must
    produce exactly these fields, or replicas and checkpoints of different writers disagree."""
    ops = [
        Op("start", seq=3, base=30),
        Op("seen", seq=3, count=2, base=30),
        Op("seen", seq=4, count=3, base=32, delayed={1: 7.5}, skip=[2]),
        Op("seen", seq=5, count=0, base=35, corrupt=True),
        Op("expire", seq=6, base=35),
        claim(3, 0, "t1", until=99.5, member="m1"),
        Op("extend", 3, 0, token="t1", until=120.0),
        Op("ack", 3, 0, token="t1"),
        Op("release", 3, 1, token="t2", not_before=50.0),
        Op("release", 3, 1, token="t3", not_before=None, counted=False),
        Op("dead", 3, 1, reason="nack"),
    ]
    assert Delta(9, "m1", "nonce", 12.5, ops).to_json() == {
        "v": 1,
        "n": 9,
        "member": "m1",
        "id": "nonce",
        "at": 12.5,
        "ops": [
            {"op": "start", "seq": 3, "base": 30},
            {"op": "seen", "seq": 3, "count": 2, "base": 30},
            {"op": "seen", "seq": 4, "count": 3, "base": 32, "delayed": {"1": 7.5}, "skip": [2]},
            {"op": "seen", "seq": 5, "count": 0, "base": 35, "corrupt": True},
            {"op": "expire", "seq": 6, "base": 35},
            {"op": "claim", "seq": 3, "idx": 0, "token": "t1", "member": "m1", "until": 99.5},
            {"op": "extend", "seq": 3, "idx": 0, "token": "t1", "until": 120.0},
            {"op": "ack", "seq": 3, "idx": 0, "token": "t1"},
            {"op": "release", "seq": 3, "idx": 1, "token": "t2", "not_before": 50.0},
            {"op": "release", "seq": 3, "idx": 1, "token": "t3", "not_before": None, "counted": False},
            {"op": "dead", "seq": 3, "idx": 1, "reason": "nack"},
        ],
    }
    decoded = Delta.from_json(json.loads(json.dumps(Delta(9, "m1", "nonce", 12.5, ops).to_json())))
    assert decoded == Delta(9, "m1", "nonce", 12.5, ops)
    bare = Delta.from_json({"n": 2, "at": 1.0, "ops": [{"op": "ack"}]})
    assert (bare.member, bare.id, bare.ops) == (
        "",
        "",
        [Op("ack", seq=0, idx=0, counted=True, corrupt=False)],
    )
    assert Delta.from_json({"n": 3, "at": 1.0}).ops == [], "a delta without ops is an empty one"

    state = started(3, 2)
    apply(
        state,
        [
            claim(0, 0, "a", until=T0 + 30),
            claim(0, 1, "b"),
            Op("ack", 0, 1, token="b"),
            claim(0, 2, "c"),
            Op("release", 0, 2, token="c", not_before=T0 + 9),
            claim(1, 0, "d"),
            Op("ack", 1, 0, token="d"),
            claim(1, 1, "e"),
            Op("ack", 1, 1, token="e"),
        ],
    )
    assert state.to_json() == {
        "v": 1,
        "n": 2,
        "started": True,
        "floor": 0,
        "floor_offset": 0,
        "frontier": 1,
        "segments": {
            "0": {"count": 3, "base": 0, "done": [[1, 1]]},
            "1": {"count": 2, "base": 3, "done": [[0, 1]]},
        },
        "leases": [[0, 0, "a", "m1", T0 + 30, 1]],
        "deliveries": [[0, 2, 1]],
        "delayed": [[0, 2, T0 + 9]],
        "counters": {
            "delivered": 5,
            "redelivered": 0,
            "expired": 0,
            "acked": 3,
            "released": 1,
            "dead": 0,
            "skipped": 0,
            "collected": 0,
            "corrupt": 0,
        },
        "ids": [["m", "id", T0]],
    }
    assert CursorState.from_json(json.loads(json.dumps(state.to_json()))) == state


def test_done_indexes_are_stored_as_ranges() -> None:
    state = started(10)
    for i in (0, 1, 2, 4, 7, 8):
        apply(state, [claim(0, i, f"t{i}"), Op("ack", 0, i, token=f"t{i}")])
    assert state.to_json()["segments"]["0"]["done"] == [[0, 2], [4, 4], [7, 8]]
    assert CursorState.from_json(state.to_json()).segments[0].done == {0, 1, 2, 4, 7, 8}


def test_dead_with_a_stale_token_is_invalid_and_changes_nothing() -> None:
    state = started(1)
    apply(state, [claim(0, 0, "a", until=T0 + 10)])
    apply(state, [claim(0, 0, "b", until=T0 + 40)], at=T0 + 11)
    assert apply(state, [Op("dead", 0, 0, token="a", reason="nack")], at=T0 + 12) == [False]
    assert not state.is_done((0, 0)) and state.counters.dead == 0
    assert state.leases[(0, 0)].token == "b"


def test_open_positions_skip_a_complete_segment_above_an_open_one() -> None:
    """A segment completed above the floor stays in the window until the floor passes it; the
    positions after it are still open."""
    state = started(2, 1, 2)
    apply(state, [claim(1, 0, "a"), Op("ack", 1, 0, token="a"), claim(0, 0, "b"), Op("ack", 0, 0, token="b")])
    assert state.segments[1].complete and state.floor == 0
    assert list(state.open_positions()) == [(0, 1), (2, 0), (2, 1)]


def test_counters_count_every_event_not_just_the_first() -> None:
    state = started(1)
    for i in range(3):  # three deliveries, each lease left to expire
        assert apply(state, [claim(0, 0, f"t{i}", until=T0 + 10 * i + 5)], at=T0 + 10 * i) == [True]
    assert (state.counters.delivered, state.counters.redelivered, state.counters.expired) == (3, 2, 2)
    apply(state, [Op("release", 0, 0, token="t2", counted=False)], at=T0 + 21)
    assert state.counters.delivered == 2
    assert state.deliveries == {(0, 0): 2}


def test_claim_after_a_release_moves_the_count_into_the_lease() -> None:
    state = started(1)
    apply(state, [claim(0, 0, "a"), Op("release", 0, 0, token="a")])
    assert state.deliveries == {(0, 0): 1}
    apply(state, [Op("claim", 0, 0, token="b", until=T0 + 30)])  # no member given
    assert state.deliveries == {}, "the lease holds the count now"
    assert (state.leases[(0, 0)].member, state.leases[(0, 0)].deliveries) == ("", 2)


def test_state_round_trips_away_from_zero_and_reads_format_1_checkpoints() -> None:
    state = started(2, 3, floor=5)
    apply(state, [claim(5, 0, "a"), Op("ack", 5, 0, token="a"), claim(5, 1, "b"), Op("ack", 5, 1, token="b")])
    assert (state.floor, state.floor_offset) == (6, 2)
    assert CursorState.from_json(json.loads(json.dumps(state.to_json()))) == state
    # a format-1 checkpoint has neither counters nor ids
    old = state.to_json()
    del old["counters"], old["ids"]
    loaded = CursorState.from_json(old)
    assert (loaded.counters, loaded.ids, loaded.floor, loaded.frontier) == (Counters(), {}, 6, 6)


# -- standing claims (format 6, I20) ------------------------------------------------------------------


def stand(seq: int, count: int, tok: str = "S", until: float = T0 + 30, member: str = "m1") -> Op:
    return Op("stand", seq, count=count, token=tok, member=member, until=until)


def test_a_standing_claim_covers_only_segments_not_seen_yet() -> None:
    state = started(2)
    assert apply(state, [stand(0, 4)]) == [False]  # segment 0 is seen: it may be claimed already
    assert apply(state, [stand(1, 0)]) == [False]  # a take covers something
    assert apply(state, [Op("stand", 1, count=4, member="m1", until=T0 + 30)]) == [False]  # no token
    assert apply(state, [Op("stand", 1, count=4, token="S", member="m1")]) == [False]  # no deadline
    assert state.standing is None
    assert apply(state, [stand(1, 4)]) == [True]
    assert state.standing is not None and (state.standing.seq, state.standing.end) == (1, 5)


def test_a_covered_segment_is_leased_to_the_holder_when_seen_except_delayed_and_skipped() -> None:
    state = started(1)
    apply(state, [stand(1, 2, until=T0 + 30)])
    ok = apply(
        state,
        [Op("seen", 1, count=4, base=1, delayed={1: T0 + 5}, skip=[2]), Op("seen", 2, count=1, base=5)],
        at=T0 + 1,
    )
    assert ok == [True, True]
    assert {pos: (le.token, le.member, le.until, le.deliveries) for pos, le in state.leases.items()} == {
        (1, 0): ("S", "m1", T0 + 30, 1),
        (1, 3): ("S", "m1", T0 + 30, 1),
        (2, 0): ("S", "m1", T0 + 30, 1),
    }
    assert state.counters.delivered == 3 and state.counters.redelivered == 0
    # beyond the range: an ordinary segment
    apply(state, [Op("seen", 3, count=1, base=6)], at=T0 + 1)
    assert (3, 0) not in state.leases


def test_nobody_else_claims_a_covered_message_while_the_standing_claim_lives() -> None:
    state = started(1)
    apply(state, [stand(1, 4, until=T0 + 30)])
    apply(state, [Op("seen", 1, count=1, base=1)], at=T0 + 1)  # seen by another member: covered all the same
    assert apply(state, [claim(1, 0, "B", member="m2")], at=T0 + 30) == [False]  # live at its until
    assert apply(state, [claim(1, 0, "B", member="m2")], at=T0 + 30.5) == [True]  # ran out: a lease's rule
    lease = state.leases[(1, 0)]
    assert (lease.token, lease.deliveries) == ("B", 2) and state.counters.expired == 1
    assert apply(state, [Op("ack", 1, 0, token="S")], at=T0 + 31) == [False]  # the holder's token is stale


def test_the_holder_settles_covered_messages_with_the_standing_token() -> None:
    state = started(1)
    apply(state, [stand(1, 4)])
    ok = apply(
        state,
        [
            Op("seen", 1, count=3, base=1),
            Op("ack", 1, 0, token="S"),
            Op("release", 1, 1, token="S", counted=False),
        ],
        at=T0 + 1,
    )
    assert ok == [True, True, True]
    assert state.is_done((1, 0)) and (1, 1) not in state.leases and state.deliveries.get((1, 1)) is None
    assert apply(state, [Op("extend", 1, 2, token="S", until=T0 + 90)], at=T0 + 2) == [True]
    assert state.leases[(1, 2)].until == T0 + 90


def test_another_standing_claim_waits_until_the_first_runs_out() -> None:
    state = started(1)
    apply(state, [stand(1, 4, tok="A", until=T0 + 30, member="m1")])
    assert apply(state, [stand(1, 4, tok="B", member="m2", until=T0 + 60)], at=T0 + 30) == [False]
    assert apply(state, [stand(1, 4, tok="B", member="m2", until=T0 + 90)], at=T0 + 31) == [True]
    assert state.standing is not None and state.standing.token == "B"


def test_a_standing_claim_that_ran_out_counts_a_possible_delivery_of_what_it_covered() -> None:
    """The holder delivers before ``seen`` is written: if it died, the log cannot tell whether it
    did, so each message of its range counts one prior delivery (a message that kills its holder
    reaches max_deliveries instead of circling for ever)."""
    state = started(1)
    apply(state, [stand(1, 2, tok="A", until=T0 + 30, member="m1")])
    apply(state, [stand(1, 4, tok="B", until=T0 + 90, member="m2")], at=T0 + 31)
    apply(state, [Op("seen", 1, count=1, base=1), Op("seen", 2, count=1, base=2)], at=T0 + 32)
    apply(state, [Op("seen", 3, count=1, base=3)], at=T0 + 32)
    assert [(state.leases[(s, 0)].token, state.leases[(s, 0)].deliveries) for s in (1, 2, 3)] == [
        ("B", 2),
        ("B", 2),
        ("B", 1),  # beyond A's range
    ]
    assert state.counters.redelivered == 2
    assert state.suspect == []  # the frontier passed A's range


def test_a_standing_claim_nobody_renewed_leases_what_is_seen_afterwards_already_expired() -> None:
    state = started(1)
    apply(state, [stand(1, 4, tok="A", until=T0 + 30)])
    apply(state, [Op("seen", 1, count=1, base=1)], at=T0 + 40)
    assert state.leases[(1, 0)].until == T0 + 30  # counted as a delivery of A's, and claimable at once
    assert apply(state, [claim(1, 0, "B", member="m2")], at=T0 + 40) == [True]
    assert state.leases[(1, 0)].deliveries == 2


def test_renewal_moves_the_deadline_and_the_end_never_the_start_nor_the_leases_it_gave() -> None:
    state = started(1)
    apply(state, [stand(1, 2, until=T0 + 30)])
    apply(state, [Op("seen", 1, count=1, base=1)], at=T0 + 1)
    assert apply(state, [stand(2, 4, until=T0 + 60)], at=T0 + 2) == [False]  # the start stays
    assert apply(state, [stand(1, 4, until=T0 + 60, member="m2")], at=T0 + 2) == [False]  # its holder only
    assert apply(state, [stand(1, 4, until=T0 + 60)], at=T0 + 31) == [True]  # past until, nobody took it
    assert state.standing is not None and (state.standing.end, state.standing.until) == (5, T0 + 60)
    assert state.leases[(1, 0)].until == T0 + 30  # a message's lease runs out as it was given
    apply(state, [Op("seen", 2, count=1, base=2)], at=T0 + 32)
    assert state.leases[(2, 0)].until == T0 + 60


def test_an_ended_standing_claim_leaves_nothing_suspect_and_frees_the_partition_at_once() -> None:
    state = started(1)
    apply(state, [stand(1, 4, tok="A", until=T0 + 30)])
    assert apply(state, [stand(1, 0, tok="A")], at=T0 + 1) == [True]
    assert state.standing is None and state.suspect == []
    assert apply(state, [stand(1, 4, tok="B", member="m2")], at=T0 + 2) == [True]
    apply(state, [Op("seen", 1, count=1, base=1)], at=T0 + 3)
    assert state.leases[(1, 0)].deliveries == 1


def test_a_seek_keeps_the_standing_claim_but_never_lets_it_cover_a_segment_twice() -> None:
    """A seek back delivers what it replays under new leases of their own: a segment the standing
    claim leased at ``seen`` is not covered again (its first delivery carried the standing token:
    the same receipt would be handed out twice). One a seek forward passed over unseen still is:
    its holder may have handed it out before the seek, under the standing token."""
    state = started(1)
    apply(state, [stand(1, 4, until=T0 + 30)])
    apply(state, [Op("seen", 1, count=1, base=1)], at=T0 + 1)
    apply(state, [Op("seek", 4, base=4)], at=T0 + 2)  # forward, over segments 2 and 3 unseen
    apply(state, [Op("seek", 1, base=1)], at=T0 + 2)  # and back
    assert state.standing is not None and state.leases[(1, 0)].token == "S"  # kept across it (I11)
    apply(state, [Op("release", 1, 0, token="S")], at=T0 + 3)
    apply(state, [Op("seen", 1, count=1, base=1)], at=T0 + 4)  # seen again: not covered
    assert (1, 0) not in state.leases
    assert apply(state, [claim(1, 0, "B", member="m2")], at=T0 + 5) == [True]
    assert state.leases[(1, 0)].deliveries == 2
    apply(state, [Op("seen", 2, count=1, base=2)], at=T0 + 5)
    assert state.leases[(2, 0)].token == "S"  # passed over unseen: covered
    assert apply(state, [claim(2, 0, "B", member="m2")], at=T0 + 5) == [False]


def test_standing_claims_round_trip_through_json_and_leave_other_checkpoints_as_they_were() -> None:
    op = stand(3, 5, until=T0 + 30)
    assert op.to_json() == {
        "op": "stand",
        "seq": 3,
        "count": 5,
        "token": "S",
        "member": "m1",
        "until": T0 + 30,
    }
    assert Op.from_json(op.to_json()) == op
    plain = started(1)
    assert "stand" not in plain.to_json() and "suspect" not in plain.to_json()
    state = started(1)
    apply(state, [stand(1, 2, tok="A", until=T0 + 30)])
    apply(state, [stand(1, 4, tok="B", until=T0 + 90, member="m2")], at=T0 + 31)
    data = json.loads(json.dumps(state.to_json()))
    assert data["stand"] == ["B", "m2", 1, 4, T0 + 90, []] and data["suspect"] == [[1, 3]]
    again = CursorState.from_json(data)
    assert again.to_json() == state.to_json()
