"""``cost``: what a million messages cost at each publish rate (open loop), and ``awaited`` (closed loop).

``cost`` runs every rate of ``--rates`` in a fresh bucket: producers publish open loop at that rate
(:func:`bucketq.bench.workers.produce_paced`) for ``--rate-seconds`` or at most ``--messages``
messages, consumers ack every message. The measured window runs from the first due publish to the
last ack, so the consumers' polling between sparse messages is billed to those messages, as it
would be. ``awaited``: ``--tasks`` tasks share one producer, each awaiting its own publish.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from bucketq.bench.backends import Backend, Usage
from bucketq.bench.fleet import Fleet, open_fleet
from bucketq.bench.metering import Counted, CpuMeter, Meter, per_message
from bucketq.bench.params import BenchParams
from bucketq.bench.report import RunResult, build_result
from bucketq.bench.tracker import Tracker, latency_summary
from bucketq.bench.workers import produce_awaited, produce_paced

PublishFn = Callable[[Fleet, Tracker], Coroutine[Any, Any, dict[str, Any]]]


def rate_count(rate: float, seconds: float, limit: int) -> int:
    """Messages of one rate: ``rate`` for ``seconds``, at least 1, at most ``limit``."""
    return max(1, min(limit, math.ceil(rate * seconds)))


@dataclass
class Drained:
    """One publish-and-drain window of a fleet (still open: the caller closes ``fleet.run``)."""

    fleet: Fleet
    tracker: Tracker
    counted: Counted  # the window: first publish to last ack
    setup: Usage  # what the connections did before the window (registration, warm-up)
    completed: bool
    errors: list[str]
    cpu_s: float
    extra: dict[str, Any]


async def _drain(
    backend: Backend, p: BenchParams, *, topic: str, producers: int, messages: int, publish: PublishFn
) -> Drained:
    fleet = await open_fleet(backend, topic, p.partitions)
    try:
        meter = Meter(backend, fleet.run)
        await fleet.add_producers(producers)
        await fleet.add_consumers(p.consumers)
        tracker = Tracker(expected=messages)
        fleet.start_consuming(tracker, p.poll_batch)
        await asyncio.sleep(p.warmup_s)  # membership settles before the window
        start, cpu_meter = meter.mark(), CpuMeter(backend)
        publishing = asyncio.create_task(publish(fleet, tracker))
        publishing.add_done_callback(lambda _: tracker.expect(len(tracker.published)))
        completed, errors = await fleet.wait(tracker, p.idle_timeout_s)
        end = meter.mark()
        cpu, server_cpu = cpu_meter.stop()
        published = await publishing
        await fleet.finish(p.grace_s)
        counted = meter.between(start, end)
        return Drained(
            fleet, tracker, counted, start.usage, completed, errors, cpu, {**published, **server_cpu}
        )
    except BaseException:
        await fleet.finish(0.0)  # no consume loop outlives its connection
        await fleet.run.close()
        raise


def _result(
    backend: Backend,
    p: BenchParams,
    run: Drained,
    *,
    scenario: str,
    producers: int,
    messages: int,
    seconds: float,
    latencies: list[float],
    latency: str,
    extra: dict[str, Any],
) -> RunResult:
    tracker, counted, fleet = run.tracker, run.counted, run.fleet
    return build_result(
        scenario=scenario,
        backend=backend.label,
        messages=messages,
        producers=producers,
        consumers=p.consumers,
        partitions=p.partitions,
        payload_bytes=p.payload_bytes,
        seconds=seconds,
        usage=counted.client,
        setup=run.setup,
        latencies=latencies,
        latency=latency,
        tracker=tracker,
        duplicates=tracker.duplicates,
        lost=tracker.lost,
        cpu_s=run.cpu_s,
        completed=run.completed and tracker.publish_errors == 0 and len(tracker.published) == messages,
        strategy=fleet.strategy,
        server=counted.server,
        profile=fleet.run.settings.profile,
        extra={
            "window_s": round(counted.seconds, 3),
            "requests_per_message_by_op": per_message(counted.by_op, messages),
            "requests_per_message_by_key": per_message(counted.calls, messages),
            "errors": run.errors,
            **fleet.engine_counters(),
            **latency_summary(tracker),
            **run.extra,
            **extra,
        },
    )


async def run_cost_rate(backend: Backend, p: BenchParams, rate: float) -> RunResult:
    """One rate of ``cost``: open-loop publishing at ``rate`` msgs/s, every message acked."""
    count = rate_count(rate, p.rate_seconds, p.messages)

    async def publish(fleet: Fleet, tracker: Tracker) -> dict[str, Any]:
        pacing = await produce_paced(
            fleet.producers, fleet.topic, count, rate, tracker, payload_bytes=p.payload_bytes
        )
        return {
            "max_schedule_lag_ms": round(pacing.max_lag_s * 1000, 2),
            "peak_publishes_in_flight": pacing.peak_in_flight,
        }

    run = await _drain(backend, p, topic="bench-cost", producers=p.producers, messages=count, publish=publish)
    try:
        tracker = run.tracker
        first = tracker.first_publish or 0.0
        seconds = (tracker.last_ack or time.perf_counter()) - first
        publish_s = (tracker.last_publish or first) - first
        return _result(
            backend,
            p,
            run,
            scenario="cost",
            producers=p.producers,
            messages=count,
            seconds=seconds,
            latencies=tracker.receive_latencies,
            latency="due time to receive",
            extra={
                "rate": rate,
                "publish_msgs_per_s": round(count / publish_s, 1) if publish_s > 0 else None,
            },
        )
    finally:
        await run.fleet.run.close()


async def run_cost(backend: Backend, p: BenchParams) -> list[RunResult]:
    """Every rate of ``p.rates``, each in its own bucket."""
    return [await run_cost_rate(backend, p, rate) for rate in p.rates]


async def run_awaited(backend: Backend, p: BenchParams) -> list[RunResult]:
    """``p.tasks`` tasks share one producer, each awaiting its own publish; consumers drain."""

    async def publish(fleet: Fleet, tracker: Tracker) -> dict[str, Any]:
        (producer,) = fleet.producers
        await produce_awaited(
            producer, fleet.topic, p.messages, p.tasks, tracker, payload_bytes=p.payload_bytes
        )
        return {}

    run = await _drain(backend, p, topic="bench-awaited", producers=1, messages=p.messages, publish=publish)
    try:
        tracker = run.tracker
        first = tracker.first_publish or 0.0
        seconds = (tracker.last_publish or first) - first
        drained = (tracker.last_ack or time.perf_counter()) - first
        return [
            _result(
                backend,
                p,
                run,
                scenario="awaited",
                producers=1,
                messages=p.messages,
                seconds=seconds,
                latencies=tracker.publish_latencies,
                latency="publish call to durable",
                extra={
                    "tasks": p.tasks,
                    "e2e_msgs_per_s": round(p.messages / drained, 1) if drained > 0 else None,
                },
            )
        ]
    finally:
        await run.fleet.run.close()
