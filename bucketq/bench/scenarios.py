"""The four bench scenarios. Each producer and consumer is a separate connection (its own S3 client).

Requests are counted over every metered connection from its opening to the end of the measured
window (``setup_requests`` is the part spent before the window: probe, bootstrap, registration).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from bucketq.bench.backends import Backend
from bucketq.bench.fleet import GROUP, Fleet, open_fleet
from bucketq.bench.params import BenchParams, ScenarioName
from bucketq.bench.report import RunResult, build_result
from bucketq.bench.tracker import Tracker, percentile
from bucketq.bench.workers import produce, produce_paced


def _ms(values: list[float], q: float) -> float | None:
    found = percentile(values, q)
    return None if found is None else round(found * 1000, 2)


def _side_latencies(tracker: Tracker) -> dict[str, Any]:
    return {
        "publish_p50_ms": _ms(tracker.publish_latencies, 50),
        "publish_p99_ms": _ms(tracker.publish_latencies, 99),
        "receive_p50_ms": _ms(tracker.receive_latencies, 50),
        "receive_p99_ms": _ms(tracker.receive_latencies, 99),
        "ack_p50_ms": _ms(tracker.ack_latencies, 50),
        "ack_p99_ms": _ms(tracker.ack_latencies, 99),
    }


class _CpuMeter:
    """CPU seconds of this process and of the backend's server process over a window."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.own = time.process_time()
        self.server = backend.server_cpu_s()

    def stop(self) -> tuple[float, dict[str, Any]]:
        own = time.process_time() - self.own
        server_now = self.backend.server_cpu_s()
        if self.server is None or server_now is None:
            return own, {}
        return own, {"server_cpu_s": round(server_now - self.server, 2)}


def _spread(count: int, workers: int, index: int) -> range:
    return range(index, count, workers)


async def run_publish(backend: Backend, p: BenchParams) -> RunResult:
    """Producers only, unthrottled. Losses are checked against the partitions' message counts."""
    fleet = await open_fleet(backend, "bench-publish", p.partitions)
    try:
        await fleet.add_producers(p.producers)
        tracker = Tracker(expected=p.messages)
        setup = fleet.run.usage()
        meter = _CpuMeter(backend)
        await asyncio.gather(
            *(
                produce(
                    prod,
                    fleet.topic,
                    _spread(p.messages, p.producers, i),
                    tracker,
                    payload_bytes=p.payload_bytes,
                    window=p.window,
                )
                for i, prod in enumerate(fleet.producers)
            )
        )
        cpu, server_cpu = meter.stop()
        usage = fleet.run.usage()
        stored = (await fleet.admin.describe_topic(fleet.topic)).messages
        published = len(tracker.published)
        seconds = (tracker.last_publish or 0.0) - (tracker.first_publish or 0.0)
        return build_result(
            scenario="publish",
            backend=backend.name,
            messages=p.messages,
            producers=p.producers,
            consumers=0,
            partitions=p.partitions,
            payload_bytes=p.payload_bytes,
            seconds=seconds,
            usage=usage,
            setup=setup,
            latencies=tracker.publish_latencies,
            latency="publish call to durable",
            tracker=tracker,
            duplicates=max(0, stored - published - tracker.publish_errors),
            lost=max(0, published - stored),
            cpu_s=cpu,
            completed=published == p.messages,
            strategy=fleet.strategy,
            extra={"stored": stored, **server_cpu, **_side_latencies(tracker)},
        )
    finally:
        await fleet.run.close()


async def run_consume(backend: Backend, p: BenchParams) -> RunResult:
    """A preloaded backlog (loaded by an unmetered connection), consumed by consumers only."""
    fleet = await open_fleet(backend, "bench-consume", p.partitions)
    try:
        loaded = Tracker(expected=p.messages)
        loader = await fleet.admin.register_producer("bench-loader")
        await produce(
            loader,
            fleet.topic,
            range(p.messages),
            loaded,
            payload_bytes=p.payload_bytes,
            window=p.window * p.producers,
        )
        await loader.close()
        tracker = Tracker(expected=len(loaded.published), published=set(loaded.published))
        conns = [await fleet.run.connect() for _ in range(p.consumers)]
        setup = fleet.run.usage()
        meter, started = _CpuMeter(backend), time.perf_counter()
        fleet.consumers = list(
            await asyncio.gather(*(bq.register_consumer(GROUP, [fleet.topic]) for bq in conns))
        )
        fleet.start_consuming(tracker, p.poll_batch)
        completed, errors = await fleet.wait(tracker, p.idle_timeout_s)
        usage, (cpu, server_cpu) = fleet.run.usage(), meter.stop()
        seconds = (tracker.last_ack or time.perf_counter()) - started
        await fleet.finish(p.grace_s)
        return build_result(
            scenario="consume",
            backend=backend.name,
            messages=p.messages,
            producers=0,
            consumers=p.consumers,
            partitions=p.partitions,
            payload_bytes=p.payload_bytes,
            seconds=seconds,
            usage=usage,
            setup=setup,
            latencies=tracker.ack_latencies,
            latency="ack call to durable",
            tracker=tracker,
            duplicates=tracker.duplicates,
            lost=tracker.lost,
            cpu_s=cpu,
            completed=completed,
            strategy=fleet.strategy,
            extra={"errors": errors, **server_cpu, **fleet.engine_counters(), **_side_latencies(tracker)},
        )
    finally:
        await fleet.run.close()


async def _produce_and_consume(
    backend: Backend,
    p: BenchParams,
    scenario: ScenarioName,
    messages: int,
    publish: Callable[[Fleet, Tracker], Coroutine[Any, Any, None]],
    warmup_s: float,
) -> RunResult:
    fleet = await open_fleet(backend, f"bench-{scenario}", p.partitions)
    try:
        await fleet.add_producers(p.producers)
        await fleet.add_consumers(p.consumers)
        tracker = Tracker(expected=messages)
        fleet.start_consuming(tracker, p.poll_batch)
        await asyncio.sleep(warmup_s)
        setup = fleet.run.usage()
        meter = _CpuMeter(backend)
        publishing = asyncio.create_task(publish(fleet, tracker))
        publishing.add_done_callback(lambda _: tracker.expect(len(tracker.published)))
        completed, errors = await fleet.wait(tracker, p.idle_timeout_s)
        usage, (cpu, server_cpu) = fleet.run.usage(), meter.stop()
        await publishing
        first = tracker.first_publish or 0.0
        seconds = (tracker.last_ack or time.perf_counter()) - first
        await fleet.finish(p.grace_s)
        extra: dict[str, Any] = {
            "errors": errors,
            **server_cpu,
            **fleet.engine_counters(),
            **_side_latencies(tracker),
        }
        if scenario == "latency":
            extra["rate"] = p.latency_rate
        return build_result(
            scenario=scenario,
            backend=backend.name,
            messages=messages,
            producers=p.producers,
            consumers=p.consumers,
            partitions=p.partitions,
            payload_bytes=p.payload_bytes,
            seconds=seconds,
            usage=usage,
            setup=setup,
            latencies=tracker.receive_latencies,
            latency="publish to receive",
            tracker=tracker,
            duplicates=tracker.duplicates,
            lost=tracker.lost,
            cpu_s=cpu,
            completed=completed and tracker.publish_errors == 0,
            strategy=fleet.strategy,
            extra=extra,
        )
    finally:
        await fleet.run.close()


async def run_e2e(backend: Backend, p: BenchParams) -> RunResult:
    """Producers and consumers at once, unthrottled: msgs/s is messages over first publish to last ack."""

    async def publish(fleet: Fleet, tracker: Tracker) -> None:
        await asyncio.gather(
            *(
                produce(
                    prod,
                    fleet.topic,
                    _spread(p.messages, p.producers, i),
                    tracker,
                    payload_bytes=p.payload_bytes,
                    window=p.window,
                )
                for i, prod in enumerate(fleet.producers)
            )
        )

    return await _produce_and_consume(backend, p, "e2e", p.messages, publish, warmup_s=0.2)


async def run_latency(backend: Backend, p: BenchParams) -> RunResult:
    """Paced publishing at a low rate; p50/p99 of publish (message created_at) to receive."""
    count = min(p.messages, p.latency_messages)

    async def publish(fleet: Fleet, tracker: Tracker) -> None:
        await produce_paced(
            fleet.producers, fleet.topic, count, p.latency_rate, tracker, payload_bytes=p.payload_bytes
        )

    return await _produce_and_consume(backend, p, "latency", count, publish, warmup_s=p.warmup_s)


SCENARIO_RUNNERS: dict[ScenarioName, Callable[[Backend, BenchParams], Awaitable[RunResult]]] = {
    "publish": run_publish,
    "consume": run_consume,
    "e2e": run_e2e,
    "latency": run_latency,
}
