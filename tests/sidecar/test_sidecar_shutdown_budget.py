"""One shutdown budget from SIGTERM to exit: the drain is clipped to it, and an S3 outage cannot
stretch it; leases left behind expire and their messages come back, acknowledged ones never."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from aiohttp import web

from bucketq import Bucketq
from bucketq.client import DeliveredMessage, message
from bucketq.config import Settings
from bucketq.sidecar.process import EXIT_INCOMPLETE, EXIT_OK
from bucketq.sidecar.shutdown import HARD_EXIT_AFTER_S, MAX_RESERVE_S, ShutdownPlan
from tests.sidecar.sidecar_procs import REPO, SidecarFactory, create_topics, eventually
from tests.support.servers import S3Server
from tests.support.tcp_proxy import TcpProxy

EXIT_SLACK_S = 2.0  # the process must be gone by the budget plus this (interpreter exit, scheduling)
SKEW_S = 0.3  # BUCKETQ_CONSUMER__CLOCK_SKEW_S of the test sidecars


# -- the plan ------------------------------------------------------------------------------------


def test_drain_grace_is_clipped_to_the_budget_minus_a_reserve() -> None:
    plan = ShutdownPlan(budget_s=25.0, drain_grace_s=25.0, started=100.0)
    assert (plan.reserve_s, plan.drain_s, plan.deadline, plan.clipped) == (5.0, 20.0, 125.0, True)
    short = ShutdownPlan(budget_s=4.0, drain_grace_s=20.0, started=0.0)
    assert (short.reserve_s, short.drain_s, short.clipped) == (0.8, 3.2, True)
    roomy = ShutdownPlan(budget_s=60.0, drain_grace_s=10.0, started=0.0)
    assert (roomy.reserve_s, roomy.drain_s, roomy.clipped) == (MAX_RESERVE_S, 10.0, False)
    assert ShutdownPlan(budget_s=1.0, drain_grace_s=0.0).drain_s == 0.0


def test_time_left_counts_down_and_stops_at_zero() -> None:
    now = time.monotonic()
    plan = ShutdownPlan(budget_s=10.0, drain_grace_s=5.0, started=now - 3.0)
    assert 6.9 < plan.left() <= 7.0 and 1.9 < plan.drain_left() <= 2.0
    spent = ShutdownPlan(budget_s=1.0, drain_grace_s=5.0, started=now - 30.0)
    assert (spent.left(), spent.drain_left()) == (0.0, 0.0)


# -- the watchdog --------------------------------------------------------------------------------

_STUCK = """
import time
from bucketq.sidecar.shutdown import Watchdog
dog = Watchdog(time.monotonic() + {after}, 3).arm()
{disarm}
time.sleep({sleep})  # a stuck shutdown: nothing returns to the event loop
"""


def _python(code: str, timeout: float) -> tuple[int, float, str]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, timeout=timeout, text=True
    )
    return done.returncode, time.monotonic() - started, done.stderr


def test_watchdog_ends_a_stuck_process_with_the_code() -> None:
    code, elapsed, err = _python(_STUCK.format(after=0.5, disarm="", sleep=60), timeout=30)
    assert code == 3, err
    assert "shutdown did not finish in time" in err
    assert elapsed < 10, elapsed


def test_disarmed_watchdog_lets_the_process_finish() -> None:
    code, elapsed, err = _python(_STUCK.format(after=0.2, disarm="dog.disarm()", sleep=1.0), timeout=30)
    assert code == 0, err
    assert elapsed >= 1.0


# -- real sidecar processes ----------------------------------------------------------------------


@pytest.mark.slow  # 8-14 s: started early, so it never runs alone at the end
@pytest.mark.s3
@pytest.mark.e2e
async def test_sigterm_during_s3_outage_exits_within_the_budget(
    moto_server: S3Server, sidecars: SidecarFactory
) -> None:
    budget = 4.0
    with TcpProxy.to(moto_server.endpoint_url) as proxy:
        settings = moto_server.settings(s3_endpoint_url=proxy.url, s3_max_attempts=1)
        await create_topics(settings, "budget")
        a = sidecars(
            settings,
            "a",
            consumer="c",
            topics="budget",
            max_in_flight=20,
            visibility_timeout_s=4,
            settle_timeout_s=2,
            drain_grace_s=20,  # far beyond the budget: must not count
            shutdown_budget_s=budget,
        )
        with a.client() as client:
            batch = client.publish_batch("budget", [message({"n": i}) for i in range(20)])
            published = {r.result.id for r in batch.results if r.result is not None}
            assert len(published) == 20
            pulled: list[DeliveredMessage] = []
            deadline = time.monotonic() + 20
            while len(pulled) < 13:
                assert time.monotonic() < deadline, f"pulled {len(pulled)} of 13 within 20s"
                pulled += client.pull(max_messages=13 - len(pulled), wait=1)
            acked, held = pulled[:3], pulled[3:]
            assert client.ack_batch([m.receipt or "" for m in acked]).failed == 0  # durable
            eventually(lambda: a.status()["leases_held"] == 17, 20, "a to hold the 17 unacked leases")

        proxy.down()
        a.signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = a.wait_exit(budget + 10)
        took = time.monotonic() - signalled
        assert took <= budget + EXIT_SLACK_S, f"exit took {took:.1f}s; log:\n{a.log()}"
        assert code == EXIT_INCOMPLETE, a.log()
        assert "shutdown budget of 4.0s spent" in a.log(200), a.log()
        assert "clipped to the budget" in a.log(200)

        proxy.up()
        b = sidecars(settings, "b", consumer="c", topics="budget", visibility_timeout_s=30)
        again: dict[str, tuple[DeliveredMessage, float]] = {}
        with b.client() as client:
            deadline = time.monotonic() + 30
            while len(again) < 17:
                assert time.monotonic() < deadline, f"b got {len(again)} of 17 within 30s"
                for m in client.pull(max_messages=20, wait=1):
                    again[m.id] = (m, time.time())
                    client.ack(m.receipt or "")
            extra = client.pull(max_messages=20, wait=1)
    assert set(again) == published - {m.id for m in acked}, "a message was lost or an acked one came back"
    assert extra == [], "redelivered twice"
    for m in held:  # the leases a could not give back expired on their own, then came back
        redelivered, at = again[m.id]
        assert redelivered.deliveries >= 2, redelivered
        assert at >= (m.lease_until or 0) - SKEW_S, "redelivered while a's lease was still live"
    async with Bucketq(moto_server.settings(s3_bucket=settings.s3_bucket)) as bq:
        (stats,) = await bq.stats("budget", "c")
    assert (stats.acked, stats.backlog, stats.in_flight) == (20, 0, 0), stats


@pytest.mark.s3
@pytest.mark.e2e
async def test_budget_shorter_than_drain_grace_clips_the_drain(
    moto_settings: Settings, sidecars: SidecarFactory
) -> None:
    """The app never settles what it holds: the drain ends at the clipped grace (not the 30 s
    configured), the messages are requeued in the reserve, and the exit is clean (0)."""
    budget = 3.0
    await create_topics(moto_settings, "clip")
    a = sidecars(moto_settings, "a", consumer="c", topics="clip", drain_grace_s=30, shutdown_budget_s=budget)
    with a.client() as client:
        client.publish_batch("clip", [message({"n": i}) for i in range(3)])
        held = eventually(lambda: client.pull(max_messages=3, wait=1), 20, "messages to pull")
    a.signal(signal.SIGTERM)
    signalled = time.monotonic()
    eventually(lambda: _draining(a.url), 5, "a to drain")
    code = a.wait_exit(budget + 10)
    took = time.monotonic() - signalled
    plan = ShutdownPlan(budget, 30.0)
    assert plan.drain_s - 0.3 <= took <= budget + EXIT_SLACK_S, f"exit took {took:.1f}s; log:\n{a.log()}"
    assert code == EXIT_OK, a.log()
    log = a.log(200)
    assert "DRAIN_GRACE_S 30s clipped to the budget" in log and f"requeued {len(held)} messages" in log, log
    async with Bucketq(moto_settings) as bq:
        (stats,) = await bq.stats("clip", "c")
    assert (stats.in_flight, stats.backlog) == (0, 3), stats
    assert HARD_EXIT_AFTER_S < EXIT_SLACK_S  # the watchdog's bound fits what these tests allow


@pytest.mark.s3
@pytest.mark.e2e
async def test_push_request_open_at_the_drain_end_is_cut_and_requeued_without_backoff(
    moto_settings: Settings, sidecars: SidecarFactory
) -> None:
    """An app stuck on a push past the drain: the request is cut, the message requeued at once
    (not after a retry delay: the app did not fail it) and the sidecar still exits 0 in time."""
    budget = 3.0
    await create_topics(moto_settings, "stuck")
    started = asyncio.Event()

    async def receive(request: web.Request) -> web.Response:
        started.set()
        await asyncio.sleep(60)
        return web.json_response({"status": "SUCCESS"})

    app = web.Application()
    app.router.add_post("/bucketq", receive)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        a = sidecars(
            moto_settings,
            "a",
            consumer="c",
            topics="stuck",
            delivery="push",
            app_port=runner.addresses[0][1],
            push_retry_initial_s=60,  # a retry delay would keep the message away for 30-60 s
            drain_grace_s=30,
            shutdown_budget_s=budget,
        )
        with a.client() as client:
            sent = client.publish("stuck", {"n": 1})
        await asyncio.wait_for(started.wait(), 20)
        a.signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = await asyncio.to_thread(a.wait_exit, budget + 10)
        took = time.monotonic() - signalled
    finally:
        await runner.cleanup()
    assert took <= budget + EXIT_SLACK_S, f"exit took {took:.1f}s; log:\n{a.log()}"
    assert code == EXIT_OK, a.log()
    async with Bucketq(moto_settings) as bq:
        consumer = await bq.register_consumer("c", ["stuck"])
        try:
            (again,) = await consumer.poll(max_messages=1, wait=10)
            assert (again.id, again.deliveries) == (sent.id, 2)
            await consumer.ack(again.receipt)
        finally:
            await consumer.close()


def _draining(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=2):
            return False
    except urllib.error.HTTPError as exc:
        return exc.code == 503
    except OSError:
        return True  # already gone
