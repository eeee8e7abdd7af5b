"""Push retries back off exponentially: a few seconds of app outage do not exhaust maxDeliveries."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from aiohttp import web

from bucketq import Bucketq
from bucketq.config import Settings
from tests.sidecar.sidecar_procs import SidecarFactory, aeventually, create_topics

pytestmark = [pytest.mark.s3, pytest.mark.e2e]

OUTAGE_S = 5.0
INITIAL_S, MULTIPLIER, MAX_S = 0.6, 2.2, 8.0
# a redelivery comes at the earliest when its delay is over, and later by the engine's latency
# (the nack's commit, the next claim cycle): generous on a loaded 2-core machine
LATENCY_S = 1.5


def _base(failures: int) -> float:
    return min(MAX_S, INITIAL_S * MULTIPLIER ** (failures - 1))


@pytest.mark.slow  # 8-14 s: started early, so it never runs alone at the end
async def test_push_retries_back_off_and_outlast_an_app_outage(
    moto_settings: Settings, sidecars: SidecarFactory
) -> None:
    # the topic's default dead-letter policy: dead-lettered after 5 deliveries. The minimum total of
    # the first four delays (half of each step: 0.3 + 0.66 + 1.45 + 3.19 = 5.6 s) exceeds the outage,
    # so the fifth delivery at the latest meets the app back up; a fixed 0.6 s delay would have
    # spent all five deliveries within 3 s and dead-lettered the message.
    assert sum(_base(n) / 2 for n in range(1, 5)) > OUTAGE_S
    await create_topics(moto_settings, "flaky")
    attempts: list[tuple[float, int]] = []
    outage_until: list[float] = []

    async def receive(request: web.Request) -> web.Response:
        body: dict[str, Any] = await request.json()
        now = time.monotonic()
        attempts.append((now, body["deliveries"]))
        if not outage_until:
            outage_until.append(now + OUTAGE_S)  # the outage starts with the first push
        if now < outage_until[0]:
            return web.json_response({"error": "unavailable"}, status=503)
        return web.json_response({"status": "SUCCESS"})

    app = web.Application()
    app.router.add_post("/bucketq", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        sc = sidecars(
            moto_settings,
            "flaky",
            consumer="c",
            topics="flaky",
            delivery="push",
            app_port=port,
            push_retry_initial_s=INITIAL_S,
            push_retry_multiplier=MULTIPLIER,
            push_retry_max_s=MAX_S,
        )
        async with sc.aclient() as client:
            published = await client.publish("flaky", {"n": 1})
        await aeventually(lambda: sc.status()["counters"]["acked"] >= 1, 30, "the message to be acked")
        status = sc.status()
    finally:
        await runner.cleanup()

    times = [t for t, _ in attempts]
    assert [d for _, d in attempts] == list(range(1, len(attempts) + 1)), attempts
    assert 4 <= len(attempts) <= 5, f"{len(attempts)} deliveries: {attempts}"
    assert times[-1] >= outage_until[0] and times[-2] < outage_until[0], "acked during the outage?"
    gaps = [b - a for a, b in itertools.pairwise(times)]
    for failures, gap in enumerate(gaps, start=1):
        base = _base(failures)
        assert base / 2 - 0.05 <= gap <= base + LATENCY_S, (failures, gap, gaps)
    assert gaps[2] > gaps[0] * 1.5, f"the gaps between redeliveries did not grow: {gaps}"
    if len(gaps) > 3:
        assert gaps[3] > gaps[1] * 1.5, f"the gaps between redeliveries did not grow: {gaps}"

    assert status["counters"]["dead_lettered"] == 0, status
    async with Bucketq(moto_settings) as bq:
        (stats,) = await bq.stats("flaky", "c")
        assert (stats.acked, stats.backlog, stats.in_flight) == (1, 0, 0), stats
        dlq = await bq.register_consumer("inspect", ["flaky.dlq"], start_position="earliest")
        try:
            assert await dlq.poll(max_messages=1, wait=1) == [], f"{published.id} was dead-lettered"
        finally:
            await dlq.close()
