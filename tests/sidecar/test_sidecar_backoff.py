"""The push retry schedule: min(max, initial * multiplier**(n-1)) with equal jitter."""

from __future__ import annotations

import random

import pytest

from bucketq.sidecar.backoff import RetryBackoff


def test_base_grows_by_the_multiplier_and_stops_at_the_cap() -> None:
    b = RetryBackoff(initial_s=0.5, max_s=10.0, multiplier=3.0)
    assert [b.base(n) for n in range(1, 7)] == [0.5, 1.5, 4.5, 10.0, 10.0, 10.0]
    assert b.base(0) == 0.5  # no failure counted yet (a message delivered before the count existed)
    # a long-failing message: no float overflow, just the cap
    assert b.base(5000) == 10.0
    assert RetryBackoff(1.0, 1e300, 1e10).base(1000) == 1e300


def test_multiplier_one_is_a_fixed_delay() -> None:
    b = RetryBackoff(initial_s=2.0, max_s=60.0, multiplier=1.0)
    assert {b.base(n) for n in range(1, 50)} == {2.0}


def test_equal_jitter_stays_within_half_and_whole_of_the_step() -> None:
    b = RetryBackoff(initial_s=1.0, max_s=60.0, multiplier=2.0)
    assert b.delay(3, lambda: 0.0) == 2.0  # the floor: half of 4
    assert b.delay(3, lambda: 0.999999) == pytest.approx(4.0, abs=1e-5)  # the ceiling: the step
    assert b.delay(10, lambda: 0.5) == 45.0  # capped at 60 before the jitter: 30 + 15
    rng = random.Random(7)
    for n in range(1, 12):
        base = min(60.0, 2.0 ** (n - 1))
        samples = [b.delay(n, rng.random) for _ in range(300)]
        assert all(base / 2 <= d <= base for d in samples), (n, min(samples), max(samples))
        # jitter really spreads the delays (pods that failed together do not retry in lock-step)
        assert max(samples) - min(samples) > base / 4, n
    # with the default random source too
    assert all(0.5 <= b.delay(2) <= 2.0 for _ in range(100))


def test_with_a_multiplier_above_two_every_delay_outgrows_the_previous_one() -> None:
    """Equal jitter keeps a delay within [step/2, step]: steps growing more than 2x never overlap."""
    b = RetryBackoff(initial_s=0.1, max_s=1000.0, multiplier=2.5)
    rng = random.Random(11)
    for _ in range(200):
        delays = [b.delay(n, rng.random) for n in range(1, 8)]
        assert delays == sorted(delays)


@pytest.mark.parametrize(
    ("initial", "maximum", "multiplier", "problem"),
    [
        (0.0, 1.0, 2.0, "initial retry delay must be positive"),
        (-1.0, 1.0, 2.0, "initial retry delay must be positive"),
        (2.0, 1.0, 2.0, "maximum retry delay 1.0 is below the initial 2.0"),
        (1.0, 2.0, 0.5, "multiplier must be at least 1"),
        (float("nan"), 2.0, 2.0, "initial retry delay must be positive"),
    ],
)
def test_invalid_schedules_are_refused(
    initial: float, maximum: float, multiplier: float, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        RetryBackoff(initial, maximum, multiplier)
