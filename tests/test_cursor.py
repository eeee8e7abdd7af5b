"""The cursor rules (DESIGN.md 2.3) as pure functions: each op's validity and effect."""

from __future__ import annotations

import json

import pytest

from bucketq.core.cursor import CursorState, Delta, Op, apply_delta

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
    results = apply(state, [Op("seen", seq=1, count=3), Op("seen", seq=0, count=2), Op("seen", seq=0, count=2)])
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
        [Op("ack", 0, 0, token="a"), Op("extend", 0, 0, token="a", until=T0 + 99),
         Op("release", 0, 0, token="a")],
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
        [Op("dead", 0, 0, token="a", reason="nack"), Op("dead", 0, 1, reason="max"),
         Op("dead", 0, 2, reason="max")],
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


def test_unknown_op_is_invalid_not_fatal() -> None:
    state = started(1)
    assert apply(state, [Op("frobnicate", 0, 0)]) == [False]


def test_delta_out_of_order_is_an_error() -> None:
    state = started(1)
    with pytest.raises(ValueError, match="applied to state"):
        apply_delta(state, Delta(state.n + 2, "m", "id", T0, []))


def test_state_and_delta_round_trip_through_json() -> None:
    state = started(3, 2)
    apply(state, [claim(0, 0, "a"), claim(0, 1, "b"), Op("ack", 0, 1, token="b"),
                  Op("release", 0, 0, token="a", not_before=T0 + 9)])
    again = CursorState.from_json(json.loads(json.dumps(state.to_json())))
    assert again == state
    delta = Delta(7, "m", "x", T0, [Op("seen", seq=3, count=2, base=9, delayed={0: 1.5}, skip=[1]),
                                    claim(0, 0, "t")])
    assert Delta.from_json(json.loads(json.dumps(delta.to_json()))).to_json() == delta.to_json()
