"""When a fence passed a number, read from its history (I1): the store's times alone decide
whether a put that the fence now covers was part of the partition or an orphan."""

from __future__ import annotations

import pytest

from bucketq.core.fences import FENCE_HISTORY, FenceValue, took_before_passed

# floors 3 (written at 100 s), 5 (at 160 s), now 9 (the object's Last-Modified 220 s)
FENCE = FenceValue(9, history=((3, 100.0), (5, 160.0)))
MODIFIED = 220.0


@pytest.mark.parametrize(
    ("n", "landed", "expected"),
    [
        (4, 159.0, True),  # landed before floor 5 passed 4: part of the partition
        (4, 160.0, True),  # same second, truncated: a freed 4 is stamped at least a second later
        (4, 161.0, False),  # after the fence passed 4: GC may have freed it: an orphan
        (2, 99.0, True),  # the first floor ever written passed 2 at 100 s (history not full)
        (2, 101.0, False),
        (6, 219.0, True),  # passed by the current floor, written at 220 s
        (6, 221.0, False),
        (9, 500.0, True),  # the fence is not above 9: nothing to tell
    ],
)
def test_the_first_floor_above_a_number_dates_its_passing(n: int, landed: float, expected: bool) -> None:
    assert took_before_passed(FENCE, MODIFIED, n, landed) is expected


def test_a_history_that_dropped_the_passing_gives_only_an_upper_bound() -> None:
    history = tuple((10 + i, 1000.0 + i) for i in range(FENCE_HISTORY))
    fence = FenceValue(100, history=history)
    assert took_before_passed(fence, 2000.0, 5, 999.0) is None, "floor 10 may have passed 5 long before"
    assert took_before_passed(fence, 2000.0, 5, 1001.0) is False, "after the upper bound: surely an orphan"
    assert took_before_passed(fence, 2000.0, 10, 1000.5) is True, "floor 11 passed 10 at 1001 s, exactly"


def test_a_tombstone_never_vouches_for_a_put() -> None:
    fence = FenceValue(9, deleted=True)
    assert took_before_passed(fence, 220.0, 4, 1.0) is False
