"""The four classic bench scenarios. Each producer and consumer is a separate connection (its own S3 client).

Requests are counted over every metered connection from its opening to the end of the measured
window (``setup_requests`` is the part spent before the window: probe, bootstrap, registration);
on moto the server counts the same span too (:mod:`bucketq.bench.metering`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from bucketq.bench.backends import Backend
from bucketq.bench.fleet import GROUP, Fleet, open_fleet
from bucketq.bench.metering import CpuMeter, Meter, window_counts
from bucketq.bench.params import BenchParams, ScenarioName
from bucketq.bench.report import RunResult, build_result
from bucketq.bench.tracker import Tracker, latency_summary
from bucketq.bench.workers import produce, produce_paced


def spread(count: int, workers: int, index: int) -> range:
    """The message numbers worker ``index`` of ``workers`` publishes."""
    return range(index, count, workers)


async def run_publish(backend: Backend, p: BenchParams) -> RunResult:
    """Producers only, unthrottled. Losses are checked against the partitions' message counts."""
    fleet = await open_fleet(backend, "bench-publish", p.partitions)
    try:
        meter = Meter(backend, fleet.run)
        opened = meter.mark()
        await fleet.add_producers(p.producers)
        tracker = Tracker(expected=p.messages)
        setup = fleet.run.usage()
        cpu_meter = CpuMeter(backend)
        await asyncio.gather(
            *(
                produce(
                    prod,
                    fleet.topic,
                    spread(p.messages, p.producers, i),
                    tracker,
                    payload_bytes=p.payload_bytes,
                    window=p.window,
                )
                for i, prod in enumerate(fleet.producers)
            )
        )
        cpu, server_cpu = cpu_meter.stop()
        counted = meter.between(opened, meter.mark())
        stored = (await fleet.admin.describe_topic(fleet.topic)).messages
        published = len(tracker.published)
        seconds = (tracker.last_publish or 0.0) - (tracker.first_publish or 0.0)
        return build_result(
            scenario="publish",
            backend=backend.label,
            messages=p.messages,
            producers=p.producers,
            consumers=0,
            partitions=p.partitions,
            payload_bytes=p.payload_bytes,
            seconds=seconds,
            usage=counted.client,
            setup=setup,
            latencies=tracker.publish_latencies,
            latency="publish call to durable",
            tracker=tracker,
            duplicates=max(0, stored - published - tracker.publish_errors),
            lost=max(0, published - stored),
            cpu_s=cpu,
            completed=published == p.messages,
            strategy=fleet.strategy,
            extra={"stored": stored, **server_cpu, **latency_summary(tracker)},
            server=counted.server,
            profile=fleet.run.settings.profile,
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
        meter = Meter(backend, fleet.run)
        opened = meter.mark()
        conns = [await fleet.run.connect() for _ in range(p.consumers)]
        setup = fleet.run.usage()
        cpu_meter, started = CpuMeter(backend), time.perf_counter()
        fleet.consumers = list(
            await asyncio.gather(*(bq.register_consumer(GROUP, [fleet.topic]) for bq in conns))
        )
        fleet.start_consuming(tracker, p.poll_batch)
        completed, errors = await fleet.wait(tracker, p.idle_timeout_s)
        counted, (cpu, server_cpu) = meter.between(opened, meter.mark()), cpu_meter.stop()
        seconds = (tracker.last_ack or time.perf_counter()) - started
        await fleet.finish(p.grace_s)
        return build_result(
            scenario="consume",
            backend=backend.label,
            messages=p.messages,
            producers=0,
            consumers=p.consumers,
            partitions=p.partitions,
            payload_bytes=p.payload_bytes,
            seconds=seconds,
            usage=counted.client,
            setup=setup,
            latencies=tracker.ack_latencies,
            latency="ack call to durable",
            tracker=tracker,
            duplicates=tracker.duplicates,
            lost=tracker.lost,
            cpu_s=cpu,
            completed=completed,
            strategy=fleet.strategy,
            extra={"errors": errors, **server_cpu, **fleet.engine_counters(), **latency_summary(tracker)},
            server=counted.server,
            profile=fleet.run.settings.profile,
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
        meter = Meter(backend, fleet.run)
        opened = meter.mark()
        await fleet.add_producers(p.producers)
        await fleet.add_consumers(p.consumers)
        tracker = Tracker(expected=messages)
        fleet.start_consuming(tracker, p.poll_batch)
        await asyncio.sleep(warmup_s)
        setup = fleet.run.usage()
        cpu_meter = CpuMeter(backend)
        window_start = meter.mark()
        publishing = asyncio.create_task(publish(fleet, tracker))
        publishing.add_done_callback(lambda _: tracker.expect(len(tracker.published)))
        completed, errors = await fleet.wait(tracker, p.idle_timeout_s)
        closed = meter.mark()
        counted, (cpu, server_cpu) = meter.between(opened, closed), cpu_meter.stop()
        window = meter.between(window_start, closed)
        await publishing
        first = tracker.first_publish or 0.0
        seconds = (tracker.last_ack or time.perf_counter()) - first
        await fleet.finish(p.grace_s)
        extra: dict[str, Any] = {
            "errors": errors,
            **server_cpu,
            **fleet.engine_counters(),
            **latency_summary(tracker),
        }
        if scenario == "latency":
            extra["rate"] = p.latency_rate
            # The top-level counts span the whole run (registration, bootstrap and the warm-up's
            # polls of an empty topic included: a fixed cost that a short run divides among few
            # messages). The window alone, first publish to last ack, is what a stream at this
            # rate costs per message, as ``cost`` counts it (bucketq.bench.cost).
            extra.update(window_counts(window, messages))
        return build_result(
            scenario=scenario,
            backend=backend.label,
            messages=messages,
            producers=p.producers,
            consumers=p.consumers,
            partitions=p.partitions,
            payload_bytes=p.payload_bytes,
            seconds=seconds,
            usage=counted.client,
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
            server=counted.server,
            profile=fleet.run.settings.profile,
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
                    spread(p.messages, p.producers, i),
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
