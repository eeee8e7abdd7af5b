"""An expired lease is redelivered within the visibility timeout plus a few seconds (invariant I16),
whatever the profile and whoever owns the partition.

Before, an expired lease was claimed again only by a cycle that ran for another reason: an idle
topic's partitions are looked at every ``poll_idle_ms`` (120 s balanced, 300 s economy), and a
partition owned by a silent member only once the group counted it gone. A member that polled 50
messages and was killed gave them back after 130 s (the release before the idle economy: 32 s).
Now every lease a member knows of schedules a claim when it comes due: the owner's at
``until + clock_skew_s``, a non-owner's ``steal_after_s`` later (the owner takes its own back
first).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bucketq import Bucketq, Settings
from tests.support.engine_helpers import Backend

# The members stay active for IDLE_AFTER_S after their last message (the default is 10 s), and the
# visibility timeout is longer: by the time the killed member's leases come due, the topic is idle
# for the joiner and only the idle cadence (poll_idle_ms: 120 s balanced, 300 s economy) would look.
# Both shorter than the defaults, so the test waits seconds less, with the same order of events.
IDLE_AFTER_S = 2.0
VT_S = 6.0
SLACK_S = 4.0  # a cycle, a write, a poll: the "few seconds" (clock_skew_s and steal_after_s apart)

HOLDER = textwrap.dedent("""\
    import asyncio, os, sys, time
    from bucketq import Bucketq, Settings

    async def main():
        settings = Settings.from_dict(
            {"backend": "file", "file_path": sys.argv[1], "profile": sys.argv[2],
             "consumer": {"visibility_timeout_s": %(vt)s, "idle_after_s": %(idle)s}})
        bq = Bucketq(settings)
        await bq.open()
        member = await bq.register_consumer("g", "t")
        held = []
        while len(held) < 40:
            held += await member.poll(50, 1.0)
        print("holding", len(held), sorted({m.partition for m in held}), flush=True)
        os._exit(0)  # as kill -9: no release, no leave; the leases stay until they expire

    asyncio.run(main())
""") % {"vt": VT_S, "idle": IDLE_AFTER_S}


@pytest.mark.e2e  # a real process, killed holding its leases
@pytest.mark.slow
@pytest.mark.parametrize("profile", ["balanced", "economy"])
async def test_a_killed_members_leases_come_back_within_the_visibility_timeout(
    tmp_path: Path, profile: str
) -> None:
    """The issue's crash: member A of a group polls 40 messages from both partitions and dies
    holding them; member B joins and polls. B owns one partition and A (still counted live for
    its heartbeat's TTL) the other: both come back within VT + clock_skew_s + steal_after_s +
    a few seconds, not at the idle fallback (120 s balanced, 300 s economy)."""
    bucket = tmp_path / "bucket"
    settings = Settings.from_dict(
        {
            "backend": "file",
            "file_path": str(bucket),
            "profile": profile,
            "consumer": {"visibility_timeout_s": VT_S, "idle_after_s": IDLE_AFTER_S},
        }
    )
    async with Bucketq(settings) as bq:
        await bq.create_topic("t", partitions=2)
        producer = await bq.register_producer("p")
        for i in range(40):
            await producer.publish("t", i, key=f"k{i}")  # keyed: both partitions
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
            ),
        }
        holder = subprocess.run(
            [sys.executable, "-c", HOLDER, str(bucket), profile],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert holder.stdout.startswith("holding 40 [0, 1]"), holder.stdout + holder.stderr[-2000:]
        died = time.monotonic()
        member = await bq.register_consumer("g", "t")
        bound = VT_S + member.settings.clock_skew_s + member.settings.steal_after_s + SLACK_S
        back: dict[int, float] = {}
        while len(back) < 40 and time.monotonic() - died < bound + 30:
            for m in await member.poll(50, 0.5):
                back.setdefault(m.payload, time.monotonic() - died)
                assert m.deliveries == 2
                await m.ack()
        late = max(back.values(), default=float("inf"))
        assert len(back) == 40, f"only {len(back)} of 40 came back within {bound + 30:.0f}s"
        assert late <= bound, f"the last lease came back {late:.1f}s after the crash (bound {bound:.1f}s)"


async def test_a_lease_the_app_dropped_comes_back_on_an_idle_topic(backend: Backend) -> None:
    """The holder itself, alive, its app never settling the message; the topic turned idle (its
    partitions looked at every poll_idle_ms, two minutes): the lease is claimed again when it
    comes due, not at the next idle look."""
    bq = await backend.connect(
        consumer={
            "visibility_timeout_s": 1.0,
            "clock_skew_s": 0.2,
            "idle_after_s": 0.2,
            "poll_idle_ms": 120_000,
            "heartbeat_idle_s": 30,
        }
    )
    await bq.create_topic("t")
    await bq.publish("t", "once")
    member = await bq.register_consumer("g", "t")
    first = await member.poll(1, 5.0)
    assert [m.payload for m in first] == ["once"]
    dropped_at = time.monotonic()  # the app drops it: no ack, no nack, no extend
    again = await member.poll(1, 10.0)
    waited = time.monotonic() - dropped_at
    assert [m.payload for m in again] == ["once"] and again[0].deliveries == 2
    assert waited < 1.0 + 0.2 + SLACK_S, f"came back after {waited:.1f}s"
    await again[0].ack()


async def test_a_message_nacked_with_a_delay_comes_back_when_the_delay_ends_on_an_idle_topic(
    backend: Backend,
) -> None:
    """A nack with a delay (a push retry's back-off) on a topic that turned idle (its partitions
    looked at every poll_idle_ms, two minutes): the message is claimed again when its delay ends,
    not at the next idle look (a push retry came 3 s late under load at the balanced wake poll)."""
    bq = await backend.connect(
        consumer={"idle_after_s": 0.2, "poll_idle_ms": 120_000, "heartbeat_idle_s": 30, "clock_skew_s": 0.2}
    )
    await bq.create_topic("t")
    await bq.publish("t", "retry me")
    member = await bq.register_consumer("g", "t")
    first = await member.poll(1, 5.0)
    assert [m.payload for m in first] == ["retry me"]
    # the delay counts from the nack call (its not-before is stamped before the settlement is
    # written), so the wait is timed from there: timed from the return, a slow write made the
    # delay look short
    nacked_at = time.monotonic()
    await first[0].nack(delay=1.0)
    again = await member.poll(1, 10.0)
    waited = time.monotonic() - nacked_at
    assert [m.payload for m in again] == ["retry me"] and again[0].deliveries == 2
    assert 1.0 - 0.05 <= waited < 1.0 + SLACK_S, f"came back after {waited:.1f}s"
    await again[0].ack()
