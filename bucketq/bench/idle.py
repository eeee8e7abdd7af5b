"""``idle``: what an idle consumer costs per month, and how fast it picks up a message after a silence.

One member of a consumer group waits in :meth:`bucketq.Consumer.listen`, as an application would,
on a topic nobody publishes to; after ``--idle-warmup`` seconds its requests are counted for the
rest of ``--idle-seconds``. A second member joins and both are counted the same way (the increment
is what one more idle member costs). Then, ``--pickups`` times: ``--silence-seconds`` of silence
(counted as idle time of the two members and the now registered producer; a silence after a
pickup includes what that delivery left to do: its ack, the members' busier polling right after a
message), one message, and the time from its publish call to the handler.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bucketq import Consumer, Message, Producer
from bucketq.bench.backends import Backend, Usage
from bucketq.bench.fleet import Fleet, open_fleet
from bucketq.bench.metering import Counted, CpuMeter, Meter
from bucketq.bench.params import BenchParams
from bucketq.bench.pricing import MINUTES_PER_MONTH, SQS_IDLE_REQUESTS_PER_MIN, SQS_IDLE_USD_PER_MONTH
from bucketq.bench.report import RunResult, build_result
from bucketq.bench.tracker import Tracker, ms
from bucketq.bench.workers import make_payload, publish_one


class PickupTimeout(RuntimeError):
    """A message published after a silence was not handled in time."""


def per_minute(counts: Mapping[str, int], seconds: float) -> dict[str, float]:
    """Counts over ``seconds`` as a rate per minute (rounded), largest first."""
    items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return {k: round(v * 60 / seconds, 3) for k, v in items} if seconds > 0 else {}


def usd_per_month(counted: Counted) -> float:
    """The list price of a 30-day month at the window's request rate."""
    return counted.usd * 60 * MINUTES_PER_MONTH / counted.seconds if counted.seconds > 0 else 0.0


def phase_report(name: str, members: int, counted: Counted) -> dict[str, Any]:
    """One measured idle window: rates per minute (as counted, and both counts raw) and its price."""
    month = usd_per_month(counted)
    return {
        "phase": name,
        "members": members,
        "seconds": counted.seconds,
        "counted_at": counted.counted_at,
        "requests_per_min": round(counted.total * 60 / counted.seconds, 3) if counted.seconds > 0 else 0.0,
        "requests_per_min_by_op": per_minute(counted.by_op, counted.seconds),
        "requests_per_min_by_key": per_minute(counted.calls, counted.seconds),
        "client_requests_by_op": dict(sorted(counted.client.requests.items())),
        "server_requests_by_op": (
            dict(sorted(counted.server.by_op.items())) if counted.server is not None else None
        ),
        "usd_per_month": month,
        "usd_per_month_per_member": month / members,
    }


def increment(one: dict[str, Any], two: dict[str, Any]) -> dict[str, Any]:
    """What the second member added: rates of ``two`` minus ``one`` (a key may go down: rebalance)."""
    keys = dict.fromkeys((*one["requests_per_min_by_key"], *two["requests_per_min_by_key"]))
    delta = {
        k: round(two["requests_per_min_by_key"].get(k, 0.0) - one["requests_per_min_by_key"].get(k, 0.0), 3)
        for k in keys
    }
    return {
        "requests_per_min": round(two["requests_per_min"] - one["requests_per_min"], 3),
        "requests_per_min_by_key": {k: v for k, v in sorted(delta.items(), key=lambda kv: -abs(kv[1])) if v},
        "usd_per_month": two["usd_per_month"] - one["usd_per_month"],
    }


@dataclass
class Members:
    """The idle group's members, each on its own connection, each in its own ``listen()`` loop."""

    fleet: Fleet
    tracker: Tracker
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    consumers: list[Consumer] = field(default_factory=list)
    loops: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.consumers)

    async def handle(self, msg: Message) -> None:
        # "acked" here means handled: listen() acks once the handler returns
        self.tracker.on_received(msg.created_at, time.time())
        self.tracker.on_acked(msg.id, time.perf_counter())

    async def join(self) -> None:
        bq = await self.fleet.run.connect()
        consumer = await bq.register_consumer(self.fleet.group, [self.fleet.topic])
        self.consumers.append(consumer)
        self.loops.append(asyncio.create_task(consumer.listen(self.handle, stop=self.stop)))

    def check(self) -> None:
        """Raise the error of a member's loop that ended on its own."""
        for loop in self.loops:
            if loop.done() and not loop.cancelled() and (exc := loop.exception()) is not None:
                raise exc

    async def idle(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.check()
            await asyncio.sleep(min(left, 1.0))
        self.check()

    async def wait_handled(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.tracker.acked < count:
            self.check()
            if time.monotonic() > deadline:
                raise PickupTimeout(f"message {count} not handled within {timeout_s:g}s")
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.loops, return_exceptions=True)


async def _measured_idle(members: Members, meter: Meter, p: BenchParams) -> Counted:
    await members.idle(p.idle_warmup_s)
    start = meter.mark()
    await members.idle(p.idle_seconds - p.idle_warmup_s)
    return meter.between(start, meter.mark())


async def run_pickups(
    members: Members, producer: Producer, meter: Meter, p: BenchParams
) -> tuple[list[Counted], list[Counted], list[str]]:
    """Silence, publish, delivery, ``p.pickups`` times: (silence windows, delivery windows, errors)."""
    silences: list[Counted] = []
    deliveries: list[Counted] = []
    tracker, topic = members.tracker, members.fleet.topic
    for n in range(p.pickups):
        quiet = meter.mark()
        await members.idle(p.silence_s)
        due = meter.mark()
        silences.append(meter.between(quiet, due))
        await publish_one(producer, topic, make_payload(n, p.payload_bytes), tracker, created_at=time.time())
        if tracker.publish_errors:
            return silences, deliveries, [f"publish {n} failed"]
        try:
            await members.wait_handled(n + 1, p.idle_timeout_s)
        except PickupTimeout as exc:
            return silences, deliveries, [str(exc)]
        deliveries.append(meter.between(due, meter.mark()))
    return silences, deliveries, []


def _total(windows: list[Counted]) -> Counted | None:
    if not windows:
        return None
    out = windows[0]
    for w in windows[1:]:
        out = out + w
    return out


async def run_idle(backend: Backend, p: BenchParams) -> list[RunResult]:
    """One idle member, then two, then pickups after silences; one result."""
    fleet = await open_fleet(backend, "bench-idle", p.partitions)
    members: Members
    if p.via == "sidecar":
        from bucketq.bench.idle_sidecar import SidecarMembers

        members = SidecarMembers(fleet, Tracker(expected=p.pickups))
    else:
        members = Members(fleet, Tracker(expected=p.pickups))
    try:
        meter = Meter(backend, fleet.run)
        cpu_meter = CpuMeter(backend)
        await members.join()
        setup = fleet.run.usage()
        one = await _measured_idle(members, meter, p)
        await members.join()
        two = await _measured_idle(members, meter, p)
        producer = await (await fleet.run.connect()).register_producer(f"{fleet.topic}-producer")
        silences, deliveries, errors = await run_pickups(members, producer, meter, p)
        await asyncio.sleep(p.grace_s)  # a late duplicate shows up
        members.check()
        cpu, server_cpu = cpu_meter.stop()
        return [_result(backend, p, members, setup, one, two, silences, deliveries, errors, cpu, server_cpu)]
    finally:
        await members.close()
        await fleet.run.close()


def _result(
    backend: Backend,
    p: BenchParams,
    members: Members,
    setup: Usage,
    one: Counted,
    two: Counted,
    silences: list[Counted],
    deliveries: list[Counted],
    errors: list[str],
    cpu: float,
    server_cpu: dict[str, Any],
) -> RunResult:
    tracker, fleet = members.tracker, members.fleet
    phases = [phase_report("1 member", 1, one), phase_report("2 members", 2, two)]
    quiet = _total(silences)
    if quiet is not None:
        phases.append(phase_report("2 members + producer, between pickups", 2, quiet))
    delivered = _total(deliveries)
    measured = _total([one, two, *silences, *deliveries])
    assert measured is not None  # the two idle phases always ran
    latencies = tracker.receive_latencies
    pickups: dict[str, Any] = {
        "count": p.pickups,
        "handled": tracker.acked,
        "silence_s": p.silence_s,
        "p50_ms": ms(latencies, 50),
        "p99_ms": ms(latencies, 99),
        "latencies_ms": [round(x * 1000, 2) for x in latencies],
        "requests_per_pickup_by_key": (
            {k: round(v / len(deliveries), 3) for k, v in delivered.calls.most_common()}
            if delivered is not None
            else {}
        ),
    }
    return build_result(
        scenario="idle",
        backend=backend.label,
        messages=len(tracker.published),
        producers=1,
        consumers=members.count,
        partitions=p.partitions,
        payload_bytes=p.payload_bytes,
        seconds=measured.seconds,
        usage=measured.client,
        setup=setup,
        latencies=latencies,
        latency="publish to handler, after a silence",
        tracker=tracker,
        duplicates=tracker.duplicates,
        lost=tracker.lost,
        cpu_s=cpu,
        completed=not errors and tracker.acked == p.pickups,
        strategy=fleet.strategy,
        server=measured.server,
        profile=fleet.run.settings.profile,
        via=p.via,
        per_message=False,
        extra={
            "usd_per_idle_month_per_member": phases[0]["usd_per_month"],
            "sqs_usd_per_idle_month": SQS_IDLE_USD_PER_MONTH,
            "sqs_requests_per_min": SQS_IDLE_REQUESTS_PER_MIN,
            "pickup_p50_ms": pickups["p50_ms"],
            "pickup_p99_ms": pickups["p99_ms"],
            "idle_warmup_s": p.idle_warmup_s,
            "phases": phases,
            "member_increment": increment(phases[0], phases[1]),
            "pickups": pickups,
            "errors": errors,
            **server_cpu,
        },
    )
