"""When a member looks next (core/cadence.py): each decision as a table of cases.

The values are those of the balanced profile (ConsumerSettings' defaults: poll_min 10 ms,
poll_max 100 ms, wake_poll 5 s, poll_idle 120 s, idle_after 10 s, foreign_poll 2 s up to 60 s,
heartbeat 5 s, 30 s while quiet, member TTL 20 s) unless a row says otherwise.
"""

from __future__ import annotations

import math

import pytest

from bucketq.config import PROFILES, ConsumerSettings, Profile
from bucketq.core import cadence

BALANCED = ConsumerSettings()


def profile(name: Profile) -> ConsumerSettings:
    return ConsumerSettings(**PROFILES[name]["consumer"])


@pytest.mark.parametrize(
    ("attempt", "jitter", "expected"),
    [
        (1, 1.0, 0.1),
        (1, 0.5, 0.05),
        (2, 1.0, 0.2),
        (3, 1.0, 0.4),
        (5, 1.0, 1.6),
        (6, 1.0, 2.0),  # 3.2 capped
        (6, 0.5, 1.0),  # the jitter applies after the cap
        (40, 0.75, 1.5),  # doublings stop at RETRY_DOUBLINGS
    ],
)
def test_retry_delay(attempt: int, jitter: float, expected: float) -> None:
    assert cadence.retry_delay(attempt, jitter) == pytest.approx(expected)


def test_retry_jitter_halves_at_most() -> None:
    assert cadence.RETRY_JITTER == (0.5, 1.0)


@pytest.mark.parametrize(("delay", "expected"), [(0.05, 0.1), (0.4, 0.8), (0.6, 1.0), (1.0, 1.0)])
def test_start_retry_doubles_to_a_second(delay: float, expected: float) -> None:
    assert cadence.next_start_retry(delay) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("name", "all_idle", "after_progress", "after_failure", "ceiling"),
    [
        ("balanced", False, 0.01, 0.1, 0.1),
        ("balanced", True, 0.01, 0.1, 5.0),  # idle: the wake turn
        ("latency", False, 0.01, 0.025, 0.025),
        ("latency", True, 0.01, 0.025, 0.5),
        ("economy", True, 0.01, 0.5, 15.0),
    ],
)
def test_loop_polls(
    name: Profile, all_idle: bool, after_progress: float, after_failure: float, ceiling: float
) -> None:
    s = profile(name)
    assert cadence.poll_after_progress(s) == pytest.approx(after_progress)
    assert cadence.poll_after_failure(s) == pytest.approx(after_failure)
    assert cadence.poll_ceiling(s, all_idle=all_idle) == pytest.approx(ceiling)


def test_the_idle_ceiling_is_the_idle_fallback_when_that_is_sooner_than_a_wake_turn() -> None:
    s = ConsumerSettings(wake_poll_ms=60_000, poll_idle_ms=20_000)
    assert cadence.poll_ceiling(s, all_idle=True) == pytest.approx(20.0)


@pytest.mark.parametrize(
    ("delay", "ceiling", "expected"), [(0.01, 0.1, 0.02), (0.08, 0.1, 0.1), (0.1, 5.0, 0.2)]
)
def test_loop_backs_off_by_doubling(delay: float, ceiling: float, expected: float) -> None:
    assert cadence.poll_backed_off(delay, ceiling) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("failed", "settle_at", "wake_turn", "lease_due", "expected"),
    [
        (False, math.inf, math.inf, math.inf, 0.1),  # nothing due: the poll delay
        (False, 100.03, math.inf, math.inf, 0.03),  # settlements due sooner
        (False, math.inf, 1000.05, math.inf, 0.05),  # a wake turn sooner
        (False, math.inf, math.inf, 1000.02, 0.02),  # a lease comes due sooner (I16)
        (False, 99.0, math.inf, math.inf, 0.0),  # overdue: at once
        (True, 100.0, 1000.0, 1000.0, 0.1),  # after a failure the store rests the whole delay
    ],
)
def test_loop_wait(
    failed: bool, settle_at: float, wake_turn: float, lease_due: float, expected: float
) -> None:
    got = cadence.loop_wait(
        0.1,
        failed=failed,
        now=100.0,
        wall=1000.0,
        settle_at=settle_at,
        wake_turn=wake_turn,
        lease_due=lease_due,
    )
    assert got == pytest.approx(expected)


@pytest.mark.parametrize(("backoff", "expected"), [(0.1, 0.025), (0.02, 0.01), (4.0, 1.0)])
def test_a_find_quarters_the_tail_backoff(backoff: float, expected: float) -> None:
    assert cadence.discovery_after_find(BALANCED, backoff) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("backoff", "tail_reached", "find_gap", "rung", "expected"),
    [
        (0.01, False, 0.2, False, (0.01, 0.01)),  # a backlog: read on at once
        (0.01, True, math.inf, False, (0.01, 0.01)),  # a first find
        (0.01, True, 0.2, False, (0.05, 0.12)),  # a stream: 0.6 of the gap
        (0.01, True, 0.05, False, (0.05, 0.05)),  # ... at least half a slowest poll
        (0.01, True, 10.0, False, (0.05, 0.3)),  # ... at most three slowest polls
        (0.01, True, 0.2, True, (0.01, 5.0)),  # rings arrive: the next one is announced
        (0.01, False, 0.2, True, (0.01, 0.01)),  # ... but a backlog is read on at once
    ],
)
def test_wait_after_find(
    backoff: float, tail_reached: bool, find_gap: float, rung: bool, expected: tuple[float, float]
) -> None:
    got = cadence.wait_after_find(BALANCED, backoff, tail_reached=tail_reached, find_gap=find_gap, rung=rung)
    assert got == pytest.approx(expected)


@pytest.mark.parametrize(
    ("backoff", "topic_idle", "quiet_for", "rung", "expected"),
    [
        (0.01, False, 1.0, False, 0.02),  # doubling
        (0.08, False, 1.0, False, 0.1),  # to a slowest poll
        (0.1, False, 11.0, False, 0.2),  # a partition quiet for idle_after_s: on towards a wake poll
        (4.0, False, 11.0, False, 5.0),
        (0.01, True, 1.0, False, 120.0),  # the whole topic idle: the fallback only
        (0.01, True, 1.0, True, 120.0),  # ... rung or not (the ring itself reads the segment)
        (0.01, False, 1.0, True, 5.0),  # rings arrive: the slow fallback at once
    ],
)
def test_discovery_after_miss(
    backoff: float, topic_idle: bool, quiet_for: float, rung: bool, expected: float
) -> None:
    got = cadence.discovery_after_miss(
        BALANCED, backoff, topic_idle=topic_idle, quiet_for=quiet_for, rung=rung
    )
    assert got == pytest.approx(expected)


@pytest.mark.parametrize(
    ("name", "backoff", "quiet_for", "topic_rung", "expected"),
    [
        # rings reach other partitions of the topic: a partition no ring reached backs off on
        # towards a wake poll at once, not only after idle_after_s of quiet
        ("balanced", 0.1, 1.0, True, 0.2),
        ("balanced", 4.0, 1.0, True, 5.0),
        ("balanced", 0.1, 1.0, False, 0.1),  # no ring anywhere: today's slowest active poll
        ("latency", 0.025, 1.0, True, 0.05),
        ("latency", 0.4, 1.0, True, 0.5),  # the bound: the latency profile's wake poll
        ("latency", 0.4, 1.0, False, 0.025),  # no ring anywhere: every 25 ms, as before
        ("latency", 0.4, 11.0, False, 0.5),  # ... until quiet for idle_after_s
        ("economy", 8.0, 1.0, True, 15.0),
    ],
)
def test_unrung_partition_of_a_rung_topic_slows_to_a_wake_poll(
    name: Profile, backoff: float, quiet_for: float, topic_rung: bool, expected: float
) -> None:
    got = cadence.discovery_after_miss(
        profile(name), backoff, topic_idle=False, quiet_for=quiet_for, topic_rung=topic_rung
    )
    assert got == pytest.approx(expected)


@pytest.mark.parametrize("name", ["latency", "balanced", "economy"])
def test_a_producer_that_cannot_ring_is_polled_within_a_wake_poll(name: Profile) -> None:
    """The bound: however long rings prove the path on the topic's other partitions, a partition
    no ring reaches is read at least every wake poll (what rung partitions' fallback polls get)."""
    settings = profile(name)
    backoff = cadence.discovery_woken(settings)
    for _ in range(40):
        backoff = cadence.discovery_after_miss(
            settings, backoff, topic_idle=False, quiet_for=0.0, topic_rung=True
        )
        assert backoff <= cadence.rung_poll_s(settings)
    assert backoff == pytest.approx(cadence.rung_poll_s(settings))


@pytest.mark.parametrize(("name", "expected"), [("latency", 0.5), ("balanced", 5.0), ("economy", 15.0)])
def test_the_rung_fallback_is_a_wake_poll(name: Profile, expected: float) -> None:
    assert cadence.rung_poll_s(profile(name)) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("rung_at", "now", "expected"), [(100.0, 100.0, True), (100.0, 110.0, True), (100.0, 110.5, False)]
)
def test_rings_count_while_fresh(rung_at: float, now: float, expected: bool) -> None:
    assert cadence.rung_lately(rung_at, now) is expected


def test_never_rung_is_not_rung() -> None:
    assert not cadence.rung_lately(-math.inf, 0.0)


def test_a_wake_starts_the_tail_poll_over() -> None:
    assert cadence.discovery_woken(BALANCED) == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("backoff", "found", "expected"),
    [(2.0, False, 4.0), (40.0, False, 60.0), (60.0, False, 60.0), (32.0, True, 2.0)],
)
def test_foreign_backoff(backoff: float, found: bool, expected: float) -> None:
    assert cadence.foreign_backoff(BALANCED, backoff, found=found) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("failed_cycles", "foreign", "failing", "ask_now"),
    [
        (0, False, False, False),
        (1, False, False, False),
        (2, False, True, True),  # the failure that makes it failing: heartbeat at once
        (3, False, True, False),  # already asked
        (2, True, True, False),  # a foreign partition's failures ask nothing
    ],
)
def test_failed_cycles(failed_cycles: int, foreign: bool, failing: bool, ask_now: bool) -> None:
    assert cadence.failing(failed_cycles) is failing
    assert cadence.ask_help_now(failed_cycles, foreign=foreign) is ask_now


@pytest.mark.parametrize(
    ("name", "all_quiet", "interval", "ttl"),
    [
        ("balanced", False, 5.0, 20.0),
        ("balanced", True, 30.0, 90.0),
        ("latency", True, 10.0, 30.0),
        ("economy", False, 10.0, 40.0),
        ("economy", True, 60.0, 180.0),
    ],
)
def test_heartbeat_interval_and_ttl(name: Profile, all_quiet: bool, interval: float, ttl: float) -> None:
    s = profile(name)
    got = cadence.heartbeat_interval(s, all_quiet=all_quiet)
    assert got == pytest.approx(interval)
    assert cadence.heartbeat_ttl(s, got) == pytest.approx(ttl)


@pytest.mark.parametrize(
    ("since_last", "interval", "announced_ttl", "due"),
    [
        (4.9, 5.0, 20.0, False),
        (5.0, 5.0, 20.0, True),
        # the cadence slowed to 30 s but the last heartbeat announced 20 s: due within a third of it
        (6.0, 30.0, 20.0, False),
        (6.7, 30.0, 20.0, True),
        (29.0, 30.0, 90.0, False),
        (30.0, 30.0, 90.0, True),
    ],
)
def test_heartbeat_due_within_the_announced_ttl(
    since_last: float, interval: float, announced_ttl: float, due: bool
) -> None:
    assert cadence.heartbeat_due(since_last, interval, announced_ttl) is due


@pytest.mark.parametrize(("heartbeat_s", "all_idle", "expected"), [(5.0, False, 5.0), (30.0, True, 60.0)])
def test_member_list_refresh(heartbeat_s: float, all_idle: bool, expected: float) -> None:
    assert cadence.refresh_interval(heartbeat_s, all_idle=all_idle) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("now", "poll_s", "rank", "members", "expected"),
    [
        (0.5, 1.0, 0, 1, 1.0),  # alone: every slot
        (1.0, 1.0, 0, 1, 2.0),  # strictly after now
        (0.5, 1.0, 0, 2, 2.0),  # seat 0 of 2: even slots
        (0.5, 1.0, 1, 2, 1.0),  # seat 1 of 2: odd slots
        (10.2, 2.0, 3, 5, 16.0),  # slots of 2 s: the next is slot 6 (seat 1); seat 3 sits at slot 8
        (0.5, 1.0, 6, 8, 1.0),  # eight members share five seats: rank 6 sits at seat 1
    ],
)
def test_next_wake_turn(now: float, poll_s: float, rank: int, members: int, expected: float) -> None:
    assert cadence.next_wake_turn(now, poll_s, rank, members) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("now", "last", "expected"), [(10.0, 0.0, 10.0), (10.0, 9.5, 10.5), (10.0, 9.0, 10.0)]
)
def test_a_ping_inside_the_gap_is_answered_at_its_end(now: float, last: float, expected: float) -> None:
    assert cadence.ping_look_at(now, last) == pytest.approx(expected)


@pytest.mark.parametrize(("ring_look", "expected"), [(math.inf, 0.1), (100.04, 0.04), (99.0, 0.0)])
def test_a_ring_look_cuts_the_loop_wait_short(ring_look: float, expected: float) -> None:
    got = cadence.loop_wait(
        0.1,
        failed=False,
        now=100.0,
        wall=1000.0,
        settle_at=math.inf,
        wake_turn=math.inf,
        lease_due=math.inf,
        ring_look=ring_look,
    )
    assert got == pytest.approx(expected)


@pytest.mark.parametrize(("name", "expected"), [("latency", 0.0125), ("balanced", 0.05), ("economy", 0.25)])
def test_ring_looks_are_half_a_slowest_poll_apart(name: Profile, expected: float) -> None:
    assert cadence.ring_look_gap(profile(name)) == pytest.approx(expected)


def test_ring_looks_wait_a_quarter_second_at_most_however_slow_the_polls() -> None:
    assert cadence.ring_look_gap(ConsumerSettings(poll_max_ms=60_000)) == pytest.approx(0.25)


# -- settlements riding along with the next claim delta -----------------------------------------------


@pytest.mark.parametrize(
    ("name", "opened", "now", "find_gap", "last_found", "expected"),
    [
        # balanced: acks wait up to commit_linger_ms (600 ms) while segments keep arriving
        ("balanced", 10.0, 10.1, 0.4, 9.9, 10.6),
        ("balanced", 10.0, 10.1, 0.7, 9.9, 10.0),  # finds further apart than the linger: at once
        ("balanced", 10.0, 10.8, 0.4, 10.0, 10.0),  # the last find too long ago: the stream stopped
        ("balanced", 10.0, 10.1, math.inf, 9.9, 10.0),  # no stream (a batch read once): at once
        # latency: acks ride the next claim of a stream of segments at most 100 ms apart, and wait
        # for it at most 100 ms (they were written at once, as a delta of their own)
        ("latency", 10.0, 10.01, 0.08, 9.95, 10.1),
        ("latency", 10.0, 10.01, 0.2, 9.95, 10.0),  # a slower stream: a delta of their own
        ("latency", 10.0, 10.2, 0.08, 10.05, 10.0),  # no find for longer than the linger: at once
        ("economy", 10.0, 10.1, 2.0, 9.5, 13.0),
    ],
)
def test_settle_at(
    name: Profile, opened: float, now: float, find_gap: float, last_found: float, expected: float
) -> None:
    got = cadence.settle_at(profile(name), opened, now=now, find_gap=find_gap, last_found=last_found)
    assert got == pytest.approx(expected)


def test_settlements_wait_at_most_a_tenth_of_the_visibility_timeout() -> None:
    settings = ConsumerSettings(commit_linger_ms=5000, visibility_timeout_s=10)
    assert cadence.settle_at(settings, 0.0, now=0.1, find_gap=0.5, last_found=0.0) == pytest.approx(1.0)
