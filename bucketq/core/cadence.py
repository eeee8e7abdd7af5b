"""When does a member look next: every timing decision of a consumer, as pure functions.

A consumer member decides, over and over, when to do its next thing: when its loop ticks again,
when a partition's tail is read again (after a find, after a miss, while rings arrive), when it
looks at an idle topic's wake object, when it heartbeats and re-reads the member list, when a
look caused by a ping or a ring may happen, when a failing partition is offered to the group, and
how long a failed store call waits before its retry. Each answer is a function here, of the
settings and of what the member last saw; the consumer (core/consumer.py) and its partition
workers (core/partition_worker.py) keep the state and only ask. Nothing here reads a clock, draws
a random number or touches the store: the callers pass the time and the jitter, so each decision
is tested by a table (tests/engine/test_cadence.py).

None of these decisions is a correctness matter: a look too early costs a request, a look too late
costs latency. What is delivered rests on the segments and the cursor logs (docs/protocol.md).
"""

from __future__ import annotations

import math

from bucketq.config import ConsumerSettings

# -- retries after a store error ---------------------------------------------------------------------

# A write that failed on the store is retried after RETRY_BASE_S doubled per attempt (at most
# RETRY_DOUBLINGS times, never over RETRY_CAP_S), times a jitter drawn from RETRY_JITTER so that
# writers failing together do not retry together. One formula for every writer (cursor deltas,
# segments).
RETRY_BASE_S = 0.05
RETRY_CAP_S = 2.0
RETRY_DOUBLINGS = 6
RETRY_JITTER = (0.5, 1.0)


def retry_delay(attempt: int, jitter: float) -> float:
    """Seconds to wait before retry ``attempt`` (1-based) of a write the store refused;
    ``jitter`` is drawn by the caller from ``RETRY_JITTER``."""
    return min(RETRY_CAP_S, RETRY_BASE_S * 2.0 ** min(attempt, RETRY_DOUBLINGS)) * jitter


# Starting a subscription's cursors (I5) retries a failing store from START_RETRY_FIRST_S, doubling
# up to START_RETRY_MAX_S (no jitter: one member, its own partitions).
START_RETRY_FIRST_S = 0.05
START_RETRY_MAX_S = 1.0


def next_start_retry(delay: float) -> float:
    return min(delay * 2, START_RETRY_MAX_S)


# -- the member's loop -------------------------------------------------------------------------------


def poll_after_progress(settings: ConsumerSettings) -> float:
    """The loop's wait after a tick that found or settled something: the shortest."""
    return settings.poll_min_ms / 1000


def poll_after_failure(settings: ConsumerSettings) -> float:
    """The loop's wait after a tick that failed: the store gets the slowest active poll of rest."""
    return settings.poll_max_ms / 1000


def poll_ceiling(settings: ConsumerSettings, *, all_idle: bool) -> float:
    """How long the loop sleeps at most between ticks: the slowest cadence it must keep (while
    every topic is idle, its wake turns or the idle fallback, whichever is sooner)."""
    ceiling = settings.poll_max_ms / 1000
    if all_idle:
        ceiling = max(ceiling, min(settings.wake_poll_ms / 1000, settings.poll_idle_ms / 1000))
    return ceiling


def poll_backed_off(delay: float, ceiling: float) -> float:
    """The loop's next wait after a wait that ran out with nothing to do: double, to the ceiling."""
    return min(delay * 2, ceiling)


def loop_wait(
    poll_delay: float,
    *,
    failed: bool,
    now: float,
    wall: float,
    settle_at: float,
    wake_turn: float,
    lease_due: float,
    ring_look: float = math.inf,
) -> float:
    """How long the loop waits before its next tick (unless woken): the poll delay, cut short by
    the settlements due (``settle_at``, monotonic), the next wake turn and the next lease due
    (wall times), and the next look a ring asked for (``ring_look``, monotonic). After a failure
    the store gets the whole poll delay of rest."""
    if failed:
        return poll_delay
    return min(
        poll_delay,
        max(0.0, settle_at - now),
        max(0.0, wake_turn - wall),
        max(0.0, lease_due - wall),
        max(0.0, ring_look - now),
    )


# -- reading a partition's tail ----------------------------------------------------------------------

# In a stream of segments, the first look after a find waits this share of the gap between the
# last two arrivals, and at most this many slowest polls (poll_max_ms).
STREAM_LEAD = 0.6
STREAM_WAIT_POLLS = 3
# A partition that was rung (a producer's doorbell, core/pings.py) within this many seconds is
# read when a ring names a segment; its fallback polling then slows to rung_poll_s: the rings
# prove the path from its producers works. Without rings for this long, polling is as before.
RING_FRESH_S = 10.0
# Ring looks at a partition are at most this far apart (cadence.ring_look_gap)
RING_LOOK_GAP_MAX_S = 0.25


def discovery_after_find(settings: ConsumerSettings, backoff: float) -> float:
    """The tail poll's backoff after a find: a quarter of it (at least ``poll_min_ms``)."""
    return max(settings.poll_min_ms / 1000, backoff / 4)


def rung_poll_s(settings: ConsumerSettings) -> float:
    """The fallback poll of a partition while rings arrive: a wake poll (at least a slowest
    active poll). A ring lost while rings arrive is found by this poll."""
    return max(settings.poll_max_ms, settings.wake_poll_ms) / 1000


def ring_look_gap(settings: ConsumerSettings) -> float:
    """Looks at a partition caused by rings are at least this far apart (half a slowest poll, as a
    stream's polls are): rings for segments appended faster are answered together, by one read and
    one claim delta, so a busy partition costs no more claim writes than polling did. Never more
    than RING_LOOK_GAP_MAX_S, however slow the polls: a ring brings a message at once."""
    return min(settings.poll_max_ms / 2000, RING_LOOK_GAP_MAX_S)


def rung_lately(rung_at: float, now: float) -> bool:
    """Whether rings arrive for a partition last rung at ``rung_at`` (monotonic)."""
    return now - rung_at <= RING_FRESH_S


def wait_after_find(
    settings: ConsumerSettings,
    backoff: float,
    *,
    tail_reached: bool,
    find_gap: float,
    rung: bool = False,
) -> tuple[float, float]:
    """(the new backoff, how long after a find to look at the tail again).

    While rings arrive, the next segment is announced: the tail is read again after the slow
    rung poll only (a backlog not yet read to its tail is read on at once). In a stream of
    segments (the tail was reached and the last two arrivals are known) the next one is due about
    one gap later: the first look waits STREAM_LEAD of that gap (at most STREAM_WAIT_POLLS slowest
    polls, so an early arrival is not kept long), then the usual doubling from half a slowest poll
    takes over. A paced stream is then found with a look or two instead of the five or six misses
    the doubling spends from ``poll_min_ms``. Otherwise (a backlog, a first find): at once.
    """
    if rung and tail_reached:
        return backoff, rung_poll_s(settings)
    if not tail_reached or find_gap == math.inf:
        return backoff, backoff
    slowest = settings.poll_max_ms / 1000
    lead = min(STREAM_LEAD * find_gap, STREAM_WAIT_POLLS * slowest)
    backoff = max(backoff, slowest / 2)
    return backoff, max(backoff, lead)


def discovery_after_miss(
    settings: ConsumerSettings,
    backoff: float,
    *,
    topic_idle: bool,
    quiet_for: float,
    rung: bool = False,
    topic_rung: bool = False,
) -> float:
    """The tail poll's backoff after a look that found nothing. The whole topic idle: only the
    fallback (the wake object wakes it); rings arriving: the rung poll at once; otherwise it
    doubles, to a slowest active poll, or to a wake poll (``rung_poll_s``) on a partition quiet
    for ``idle_after_s`` (the cost of an idle queue) or one of a topic whose other partitions
    rings reach (``topic_rung``).

    Why the last: rings on the topic prove that its producers' path to this member works, so a
    partition no ring reaches is one nobody appends to, and polling it every slowest active poll
    finds nothing (the latency profile's 25 ms polls of such partitions were most of its
    requests one message at a time). Bound: a producer that cannot ring (another network, an
    older release) is still read within a wake poll, as on a rung partition or a quiet one; a
    find makes the partition's polls fast again (``discovery_after_find``).
    """
    if topic_idle:
        return max(settings.poll_max_ms, settings.poll_idle_ms) / 1000
    if rung:
        return rung_poll_s(settings)
    ceiling = settings.poll_max_ms / 1000
    if topic_rung or quiet_for > settings.idle_after_s:
        ceiling = max(ceiling, rung_poll_s(settings))
    return min(backoff * 2, ceiling)


def discovery_woken(settings: ConsumerSettings) -> float:
    """The tail poll's backoff when the topic's wake object changed: from the start."""
    return settings.poll_min_ms / 1000


# -- settlements ---------------------------------------------------------------------------------------


def settle_linger(settings: ConsumerSettings) -> float:
    """The longest settlements (acks, nacks, extends) wait to ride along with the next claim
    delta: ``commit_linger_ms``, and at most a tenth of the visibility timeout."""
    return min(settings.commit_linger_ms / 1000, settings.visibility_timeout_s / 10)


# While a member holds a standing claim (I20) no claim delta comes to carry settlements: they, and
# the ``seen`` of the segments it handed out, wait at least this long for company (never more than
# a tenth of the visibility timeout), so a paced stream costs a cursor write per this period, not
# one per segment.
STANDING_LINGER_S = 1.0


def standing_linger(settings: ConsumerSettings) -> float:
    """How long settlements and handed-out segments' ``seen`` wait under a standing claim: the
    settlement linger, at least STANDING_LINGER_S, at most a tenth of the visibility timeout."""
    return min(settings.visibility_timeout_s / 10, max(settle_linger(settings), STANDING_LINGER_S))


def claims_expected(*, now: float, find_gap: float, last_found: float, within: float) -> bool:
    """Is a claim delta likely within ``within`` seconds? Only while segments keep arriving: the
    last two finds were that close and the last is that recent. A batch read once and settled one
    awaited ack after another gets none, so its settlements are written at once."""
    return find_gap <= within and now - last_found <= within


def settle_at(
    settings: ConsumerSettings, opened: float, *, now: float, find_gap: float, last_found: float
) -> float:
    """When (monotonic) the settlements waiting since ``opened`` are committed, unless a delta
    the partition writes anyway (the claim of its next segment) takes them first.

    While the partition receives a stream of segments at most ``settle_linger`` apart, they wait
    up to that linger for the next claim delta: one cursor write then carries the claim of the
    new segment and the acks of the last (the latency profile's 100 ms lets its acks ride the
    next claim at 50 msg/s instead of each taking a delta of its own). Otherwise no company is
    coming and waiting would only delay the app: at once. ``ack()`` still returns only once its
    delta is durable; the linger changes when, never whether (the consumer also writes at once
    when the app waits on its settlements with nothing else in hand, ``Consumer._settle_due``).
    """
    linger = settle_linger(settings)
    if not claims_expected(now=now, find_gap=find_gap, last_found=last_found, within=linger):
        return opened
    return opened + linger


# -- work stealing -----------------------------------------------------------------------------------


def foreign_backoff(settings: ConsumerSettings, backoff: float, *, found: bool) -> float:
    """The wait between looks at a partition whose owner asked for help: the shortest after a
    look that claimed something, doubling to ``foreign_poll_max_s`` after one that did not."""
    if found:
        return settings.foreign_poll_ms / 1000
    return min(backoff * 2, settings.foreign_poll_max_s)


# A partition whose cycles failed this many times in a row is offered to the group (the member is
# cut off from the partition's objects while its heartbeats still land).
FAILED_CYCLES_FOR_HELP = 2


def failing(failed_cycles: int) -> bool:
    """Whether a partition with this many failed cycles in a row is offered to the group."""
    return failed_cycles >= FAILED_CYCLES_FOR_HELP


def ask_help_now(failed_cycles: int, *, foreign: bool) -> bool:
    """Whether this failure is the one that makes an owned partition failing: the member then
    heartbeats at once (asking for help) instead of at its next interval."""
    return failed_cycles == FAILED_CYCLES_FOR_HELP and not foreign


# -- heartbeats and the member list ------------------------------------------------------------------


def heartbeat_interval(settings: ConsumerSettings, *, all_quiet: bool) -> float:
    """Heartbeats (and membership and config refreshes) slow down while no topic has messages."""
    if all_quiet:
        return max(settings.heartbeat_interval_s, settings.heartbeat_idle_s)
    return settings.heartbeat_interval_s


def heartbeat_due(since_last: float, interval: float, announced_ttl: float) -> bool:
    """Invariant: a heartbeat follows the last one within the TTL that one announced, so peers
    never see a live member as gone. When the cadence slows (the topic went quiet), the last
    heartbeat announced the short TTL of the fast cadence: the next one, announcing the longer
    TTL, is due within a third of it, not a whole slow interval later."""
    return since_last >= min(interval, announced_ttl / 3)


def heartbeat_ttl(settings: ConsumerSettings, interval: float) -> float:
    """The TTL a heartbeat announces: three intervals (peers keep counting a quiet member)."""
    return max(settings.member_ttl_s, 3 * interval)


def refresh_interval(heartbeat_s: float, *, all_idle: bool) -> float:
    """How often the member list is re-read: at half the heartbeat pace while idle (joins and
    graceful leaves touch the wake object, an at-once refresh; only a crash waits for this)."""
    return 2 * heartbeat_s if all_idle else heartbeat_s


# -- the wake object and pings -----------------------------------------------------------------------

# The idle members of a group take turns at the wake object: each polls it once per round of
# min(members, WAKE_SHARE_MAX) wake polls, so the group polls it once per wake poll however many
# members it has, while the round (how long a member may sleep through a wake) stays bounded.
WAKE_SHARE_MAX = 5
# Looks caused by pings (at the wake object) or by rings that found nothing are at least this far
# apart, per member and topic: a flood of forged datagrams costs at most one GET a second each.
PING_LOOK_GAP_S = 1.0


def next_wake_turn(now: float, poll_s: float, rank: int, members: int) -> float:
    """The wall time of the next turn of the member at ``rank`` (in the sorted member list) among
    ``members`` idle members polling a wake object every ``poll_s`` as a group.

    Turns are slots of ``poll_s`` on the wall clock, dealt out in rotation to
    ``min(members, WAKE_SHARE_MAX)`` seats: members' views and clocks agreeing puts one poll in
    each slot; disagreeing only moves a pickup by a slot or two, never loses anything (I13).
    """
    seats = max(1, min(members, WAKE_SHARE_MAX))
    seat = rank % seats
    slot = math.floor(now / poll_s) + 1
    slot += (seat - slot) % seats
    return slot * poll_s


def ping_look_at(now: float, last_ping_look: float) -> float:
    """When a ping received at ``now`` may be answered: now, or at the end of the gap after the
    last look a ping caused (a ping inside the gap is answered then, not dropped)."""
    return max(now, last_ping_look + PING_LOOK_GAP_S)
