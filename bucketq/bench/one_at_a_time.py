"""``one-at-a-time``: the latency of a message nobody else keeps company, publisher and consumer apart.

A consumer waits in ``listen()`` (or, ``--via sidecar``, an app long-polls its sidecar, or its
sidecar pushes to it); a publisher in another process
(:mod:`bucketq.bench.publisher_process`) publishes the next message a random 0 to
``--one-max-gap-ms`` milliseconds after the previous one arrived, ``--one-messages`` times. Each
message's latency runs from just before its publish call (the wall time it carries) to its
handler. Requests are counted at the server (moto's access log), the publisher's included, over
the window from the first publish to the last settlement; the gaps come from a seeded generator,
so every system of a run sees the same ones.

On an S3 server the same run measures pawn-queue (``pawn-queue``, its ``listen()`` polling every
50 ms) on the same server, as the comparison (``--no-compare`` leaves it out).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import bucketq
from bucketq import Consumer, Message, Settings
from bucketq.bench.backends import Backend, Usage, process_cpu_s
from bucketq.bench.fleet import GROUP, open_fleet
from bucketq.bench.metering import Counted, CpuMeter, Meter, server_log
from bucketq.bench.params import BenchParams
from bucketq.bench.report import RunResult, build_result
from bucketq.bench.servers import _clean_env, die_with_parent, free_ports
from bucketq.bench.tracker import Tracker, ms

SCENARIO = "one-at-a-time"
PAWN = "pawn-queue"
# pawn-queue's listen() polls every interval_seconds; the comparison runs it at 50 ms
PAWN_POLL_S = 0.05
SETTLE_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 60.0

ArrivalFn = Callable[[dict[str, Any], str], None]


def settings_fields(settings: Settings) -> dict[str, Any]:
    """``settings`` as the dict another process rebuilds them from (secrets in clear: a child of
    the bench, on the bench's own server)."""
    data = settings.model_dump(mode="json")
    for name in ("s3_access_key_id", "s3_secret_access_key"):
        secret = getattr(settings, name)
        if secret is not None:
            data[name] = secret.get_secret_value()
    return data


def pawn_version() -> str | None:
    """The installed pawn-queue's version, None when it is not installed."""
    try:
        return importlib.metadata.version(PAWN)
    except importlib.metadata.PackageNotFoundError:
        return None


def pawn_config(endpoint_url: str, bucket: str, access_key: str, secret_key: str) -> dict[str, Any]:
    return {
        "s3": {
            "endpoint_url": endpoint_url,
            "bucket_name": bucket,
            "aws_access_key_id": access_key,
            "aws_secret_access_key": secret_key,
            "region_name": "us-east-1",
            "use_ssl": endpoint_url.startswith("https"),
        },
        "polling": {"interval_seconds": PAWN_POLL_S, "max_messages_per_poll": 10},
    }


# -- the publisher process -----------------------------------------------------------------------


@dataclass
class PublisherProcess:
    """The publisher child: told when to publish each message, it reports what it published."""

    process: asyncio.subprocess.Process
    log_path: Path
    replies: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    _reader: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, config: dict[str, Any], workdir: Path) -> PublisherProcess:
        here = str(Path(bucketq.__file__).resolve().parents[1])  # the child runs this very bucketq
        path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
        log_path = workdir / f"publisher-{config['kind']}.log"
        with log_path.open("wb") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bucketq.bench.publisher_process",
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=workdir,
                env={**_clean_env(), "PYTHONPATH": path},
                preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
            )
        self = cls(process, log_path)
        self._send(config)
        try:
            ready = await asyncio.wait_for(self._read(), READY_TIMEOUT_S)
        except (TimeoutError, EOFError):
            await self.stop()
            raise RuntimeError(f"the publisher did not start: {self.log_tail()}") from None
        if not ready.get("ready"):
            await self.stop()
            raise RuntimeError(f"the publisher said {ready!r}: {self.log_tail()}")
        self._reader = asyncio.get_running_loop().create_task(self._read_replies())
        return self

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def _send(self, record: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(record) + "\n").encode())

    def publish(self, n: int, at: float) -> None:
        """Publish message ``n`` at wall time ``at``."""
        self._send({"n": n, "at": at})

    async def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await self.process.stdout.readline()
        if not line:
            raise EOFError("the publisher exited")
        record: dict[str, Any] = json.loads(line)
        return record

    async def _read_replies(self) -> None:
        with contextlib.suppress(EOFError):
            while True:
                await self.replies.put(await self._read())

    def cpu_s(self) -> float | None:
        return process_cpu_s(self.process.pid)

    async def stop(self) -> None:
        """Close its stdin (it closes its connection and exits); kill it if it does not."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 15)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)


# -- the consuming side --------------------------------------------------------------------------


class Side(Protocol):
    """A consumer that calls the arrival function with each message's payload and id."""

    async def settled(self) -> None:
        """Wait until everything handled so far is settled (acked)."""

    async def close(self) -> None: ...


@dataclass
class LibrarySide:
    """A library member of the group, in ``listen()``."""

    consumer: Consumer
    arrived: ArrivalFn
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    loop: asyncio.Task[None] | None = None

    def start(self) -> None:
        async def handle(msg: Message) -> None:
            self.arrived(msg.payload, msg.id)

        self.loop = asyncio.get_running_loop().create_task(self.consumer.listen(handle, stop=self.stop))

    async def settled(self) -> None:
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while self.consumer.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.002)

    async def close(self) -> None:
        self.stop.set()
        if self.loop is not None:
            await asyncio.gather(self.loop, return_exceptions=True)


@dataclass
class PawnSide:
    """pawn-queue's consumer in its ``listen()`` (the handler acks, as its README shows)."""

    consumer: Any
    arrived: ArrivalFn
    busy: int = 0
    loop: asyncio.Task[None] | None = None

    def start(self) -> None:
        async def handle(msg: Any) -> None:
            self.busy += 1
            try:
                self.arrived(msg.payload, msg.id)
                await msg.ack()
            finally:
                self.busy -= 1

        self.loop = asyncio.get_running_loop().create_task(self.consumer.listen(handle))

    async def settled(self) -> None:
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while self.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.002)

    async def close(self) -> None:
        if self.loop is not None:
            self.loop.cancel()
            await asyncio.gather(self.loop, return_exceptions=True)


# -- one run -------------------------------------------------------------------------------------


@dataclass
class Lockstep:
    """What one run of the conversation saw."""

    tracker: Tracker
    completed: bool
    errors: list[str]
    gaps_s: list[float]


async def converse(
    publisher: PublisherProcess,
    arrivals: dict[int, float],
    tracker: Tracker,
    settled: Callable[[], Awaitable[None]],
    p: BenchParams,
    wake: asyncio.Event,
) -> Lockstep:
    """Tell the publisher to publish message 0, then each next one a random gap after the previous
    one arrived (``arrivals``: message number -> wall time of its handler, filled by the side);
    wait for every arrival, the publisher's reports and the settlements."""
    rng = random.Random(f"{SCENARIO}/{p.one_seed}")
    errors: list[str] = []
    gaps: list[float] = []
    completed = True
    count = p.one_messages
    for n in range(count):
        gap = 0.0 if n == 0 else rng.uniform(0.0, p.one_max_gap_ms / 1000)
        gaps.append(gap)
        publisher.publish(n, time.time() if n == 0 else arrivals[n - 1] + gap)
        deadline = time.monotonic() + p.idle_timeout_s
        while n not in arrivals:
            wake.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), left)
        if n not in arrivals:
            errors.append(f"message {n} did not arrive within {p.idle_timeout_s:g}s")
            completed = False
            break
    reported = 0
    while reported < len(gaps):
        try:
            reply = await asyncio.wait_for(publisher.replies.get(), p.idle_timeout_s)
        except TimeoutError:
            errors.append("the publisher did not report every publish")
            completed = False
            break
        reported += 1
        if "error" in reply:
            tracker.on_publish_error()
            errors.append(f"publish {reply['n']}: {reply['error']}")
            continue
        tracker.published.add(reply["id"])
        tracker.publish_latencies.append(float(reply["took"]))
    await settled()
    return Lockstep(tracker, completed and not tracker.publish_errors, errors, gaps)


class Arrivals:
    """The handler's bookkeeping: each message's arrival, its latency, duplicates."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker
        self.at: dict[int, float] = {}
        self.wake = asyncio.Event()

    def __call__(self, body: dict[str, Any], message_id: str) -> None:
        now = time.time()
        n = int(body["n"])
        self.tracker.on_received(float(body["sent"]), now)
        self.tracker.on_acked(message_id, time.perf_counter())  # handled (a repeat is a duplicate)
        self.at.setdefault(n, now)
        self.wake.set()


@dataclass
class Measured:
    """A run's result parts that do not depend on the system measured."""

    run: Lockstep
    counted: Counted
    cpu_s: float
    extra: dict[str, Any]


async def _measure(
    backend: Backend,
    p: BenchParams,
    counted_window: Callable[[], Callable[[], Counted]],
    side: Side,
    arrivals: Arrivals,
    publisher: PublisherProcess,
    helpers: list[int],
) -> Measured:
    """Warm up, converse, and count: the window opens just before the first publish order."""
    await asyncio.sleep(p.warmup_s)  # membership settles, the publisher's connection is warm
    helper_cpu = {pid: process_cpu_s(pid) for pid in [publisher.process.pid, *helpers]}
    cpu_meter = CpuMeter(backend)
    close_window = counted_window()
    run = await converse(publisher, arrivals.at, arrivals.tracker, side.settled, p, arrivals.wake)
    counted = close_window()
    cpu, server_cpu = cpu_meter.stop()
    others = 0.0
    for pid, before in helper_cpu.items():
        now = process_cpu_s(pid)
        if before is not None and now is not None:
            others += now - before
    extra = {**server_cpu, "other_processes_cpu_s": round(others, 2)}
    return Measured(run, counted, cpu, extra)


def _result(
    backend: Backend,
    p: BenchParams,
    measured: Measured,
    *,
    system: str,
    variant: str,
    strategy: str,
    profile: str | None,
    via: str,
) -> RunResult:
    run, counted = measured.run, measured.counted
    tracker = run.tracker
    messages = len(run.gaps_s)
    return build_result(
        scenario=SCENARIO,
        backend=backend.label,
        messages=messages,
        producers=1,
        consumers=1,
        partitions=p.partitions,
        payload_bytes=p.payload_bytes,
        seconds=counted.seconds,
        usage=counted.client,
        setup=Usage(),
        latencies=tracker.receive_latencies,
        latency="publish call to handler, publisher in another process",
        tracker=tracker,
        duplicates=tracker.duplicates,
        lost=tracker.lost,
        cpu_s=measured.cpu_s,
        completed=run.completed and tracker.acked == messages,
        strategy=strategy,
        server=counted.server,
        profile=profile,
        via=via,
        extra={
            "system": system,
            "variant": variant,
            "max_gap_ms": p.one_max_gap_ms,
            "seed": p.one_seed,
            "mean_gap_ms": round(sum(run.gaps_s) / messages * 1000, 2) if messages else None,
            "publish_call_p50_ms": ms(tracker.publish_latencies, 50),
            "publish_call_p99_ms": ms(tracker.publish_latencies, 99),
            "latencies_ms": [round(x * 1000, 2) for x in tracker.receive_latencies],
            "errors": run.errors,
            **measured.extra,
        },
    )


def _window(meter: Meter) -> Callable[[], Callable[[], Counted]]:
    def open_window() -> Callable[[], Counted]:
        start = meter.mark()
        return lambda: meter.between(start, meter.mark())

    return open_window


async def run_library(backend: Backend, p: BenchParams, workdir: Path) -> RunResult:
    """bucketq: a library member in ``listen()``, a library producer in the publisher process."""
    fleet = await open_fleet(backend, "bench-one", p.partitions)
    tracker = Tracker(expected=p.one_messages)
    arrivals = Arrivals(tracker)
    publisher: PublisherProcess | None = None
    side: LibrarySide | None = None
    try:
        meter = Meter(backend, fleet.run)
        consumer = await (await fleet.run.connect()).register_consumer(GROUP, [fleet.topic])
        side = LibrarySide(consumer, arrivals)
        side.start()
        config = {
            "kind": "bucketq",
            "settings": settings_fields(fleet.run.settings),
            "topic": fleet.topic,
            "payload_bytes": p.payload_bytes,
        }
        publisher = await PublisherProcess.start(config, workdir)
        measured = await _measure(backend, p, _window(meter), side, arrivals, publisher, [])
        return _result(
            backend,
            p,
            measured,
            system="bucketq",
            variant="library",
            strategy=fleet.strategy,
            profile=fleet.run.settings.profile,
            via="library",
        )
    finally:
        if side is not None:
            await side.close()
        if publisher is not None:
            await publisher.stop()
        await fleet.run.close()


async def run_pawn(backend: Backend, p: BenchParams, workdir: Path) -> RunResult:
    """pawn-queue on the same server: its ``listen()`` (50 ms polling), its producer in the
    publisher process."""
    from pawn_queue import PawnQueue

    server = backend.server
    assert server is not None
    bucket = server.new_bucket()
    config = pawn_config(server.endpoint_url, bucket, server.access_key, server.secret_key)
    topic = f"one-{uuid.uuid4().hex[:8]}"
    tracker = Tracker(expected=p.one_messages)
    arrivals = Arrivals(tracker)
    log = server_log(backend)
    pawn = await PawnQueue.from_config(config)
    publisher: PublisherProcess | None = None
    side: PawnSide | None = None
    async with pawn:
        try:
            await pawn.create_topic(topic)
            consumer = await pawn.register_consumer("bench", topics=[topic])
            side = PawnSide(consumer, arrivals)
            side.start()
            publisher = await PublisherProcess.start(
                {"kind": "pawn", "pawn": config, "topic": topic, "payload_bytes": p.payload_bytes}, workdir
            )

            def open_window() -> Callable[[], Counted]:
                start, at = (log.mark() if log is not None else None), time.perf_counter()

                def close() -> Counted:
                    server_counts = None
                    if log is not None and start is not None:
                        server_counts = log.count(start, log.mark(), bucket)
                    return Counted(Usage(), server_counts, time.perf_counter() - at)

                return close

            measured = await _measure(backend, p, open_window, side, arrivals, publisher, [])
        finally:
            if side is not None:
                await side.close()
            if publisher is not None:
                await publisher.stop()
    return _result(
        backend,
        p,
        measured,
        system=f"{PAWN} {pawn_version()}",
        variant=f"library, listen() polling every {PAWN_POLL_S * 1000:g} ms",
        strategy=pawn._config.effective_strategy(),
        profile=None,
        via="library",
    )


async def run_one_at_a_time(backend: Backend, p: BenchParams) -> list[RunResult]:
    """bucketq (library, or through sidecars: pull and push), then pawn-queue on the same server."""
    workdir = Path(tempfile.mkdtemp(prefix="bucketq-bench-one-"))
    results: list[RunResult] = []
    if p.via == "sidecar":
        from bucketq.bench.one_at_a_time_sidecar import run_sidecar

        results.append(await run_sidecar(backend, p, workdir, push=False))
        if p.one_push:
            results.append(await run_sidecar(backend, p, workdir, push=True))
    else:
        results.append(await run_library(backend, p, workdir))
    if p.compare and backend.server is not None and pawn_version() is not None:
        results.append(await run_pawn(backend, p, workdir))
    return results


def free_port() -> int:
    (port,) = free_ports(1)
    return port
