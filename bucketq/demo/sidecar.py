"""``bucketq demo`` (sidecar mode): an app and a producer talking HTTP to a sidecar process.

Starts a moto S3 server, creates a topic, starts ``python -m bucketq.sidecar`` and the example worker
app (``examples/worker.py``, pulling and acking over the localhost API) as separate processes, then
publishes through the sidecar's API while showing progress from its ``/v1/status``. Ends with the
books (published, acked, duplicates, losses) and the sidecar's own figures from ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bucketq.client import AsyncClient, Busy, SidecarError, message

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID
    from rich.table import Table

    from bucketq.bench.servers import S3Server
    from bucketq.demo.processes import Child

TOPIC = "demo"
CONSUMER = "demo-workers"
POLL_S = 0.1
WORKER_IDLE_EXIT_S = 10.0


@dataclass
class SidecarMetrics:
    """The sidecar's counters, summed over labels, from its Prometheus exposition."""

    counters: Counter[str] = field(default_factory=Counter)  # family name -> total
    s3_by_op: Counter[str] = field(default_factory=Counter)
    s3_by_status: Counter[str] = field(default_factory=Counter)

    @classmethod
    def parse(cls, text: str) -> SidecarMetrics:
        """Read ``/metrics`` with prometheus_client's parser."""
        from prometheus_client.parser import text_string_to_metric_families

        out = cls()
        for family in text_string_to_metric_families(text):
            if family.type != "counter":
                continue
            for sample in family.samples:
                if not sample.name.endswith("_total"):
                    continue
                out.counters[family.name] += int(sample.value)
                if family.name == "bucketq_s3_requests":
                    out.s3_by_op[sample.labels["op"]] += int(sample.value)
                    out.s3_by_status[sample.labels["status"]] += int(sample.value)
        return out

    def __getitem__(self, name: str) -> int:
        return self.counters[f"bucketq_{name}"]

    @property
    def s3_requests(self) -> int:
        return sum(self.s3_by_op.values())

    @property
    def s3_failures(self) -> int:
        return self.s3_by_status["timeout"] + self.s3_by_status["error"]


@dataclass
class SidecarOutcome:
    """What the producer published, what the worker acked, and how the processes fared."""

    messages: int
    strategy: str = ""
    published: set[str] = field(default_factory=set)
    publish_errors: int = 0
    first_publish: float | None = None  # unix time
    acks: Counter[str] = field(default_factory=Counter)  # message id -> successful acks
    last_ack: float | None = None
    metrics: SidecarMetrics | None = None  # None: the sidecar was not there to ask
    worker_summary: str | None = None
    failures: list[str] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)  # last lines of each failed process's log

    @property
    def consumed(self) -> int:
        return len(self.acks)

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.acks.values())

    @property
    def lost(self) -> int:
        return len(self.published - self.acks.keys())

    @property
    def seconds(self) -> float:
        if self.first_publish is None or self.last_ack is None:
            return 0.0
        return max(0.0, self.last_ack - self.first_publish)

    @property
    def ok(self) -> bool:
        return (
            not self.failures
            and not self.duplicates
            and not self.lost
            and len(self.published) == self.consumed == self.messages
        )

    def problems(self) -> list[str]:
        """Why the demo failed (empty when it did not)."""
        found = list(self.failures)
        if self.lost or self.duplicates:
            found.append(f"{self.lost} lost, {self.duplicates} duplicates")
        if self.publish_errors:
            found.append(f"{self.publish_errors} publish errors")
        elif not found and not (len(self.published) == self.consumed == self.messages):
            found.append(f"{self.consumed} of {self.messages} messages consumed")
        return found


async def run_sidecar_demo(
    console: Console,
    *,
    messages: int,
    producers: int,
    partitions: int,
    batch: int,
    worker: Path,
    timeout_s: float,
) -> SidecarOutcome:
    """Run the demo, printing its steps, progress and summary on ``console``; processes always stopped."""
    from bucketq.bench.servers import free_ports, serve
    from bucketq.demo.processes import start_sidecar, start_worker

    outcome = SidecarOutcome(messages)
    with contextlib.ExitStack() as stack:
        with console.status("starting a moto S3 server…"):
            server = stack.enter_context(serve("moto"))
        workdir = server.log_path.parent
        _step(console, "S3", f"moto server at {server.endpoint_url} (pid {server.process.pid})")

        with console.status(f"creating topic {TOPIC!r}…"):
            bucket, outcome.strategy = await _create_topic(server, partitions)
        _step(
            console, "topic", f"{TOPIC!r}, {partitions} partitions, in bucket {bucket} ({outcome.strategy})"
        )

        children: list[Child] = []
        stack.callback(_stop_all, children, 3.0)  # first out: before the S3 server stops
        (port,) = free_ports(1)
        url = f"http://127.0.0.1:{port}"
        started = time.monotonic()
        sidecar = start_sidecar(workdir, _sidecar_env(server, bucket, outcome.strategy, port, messages))
        children.append(sidecar)
        async with AsyncClient(url, timeout=30) as client:
            with console.status("starting the sidecar…"):
                await _wait_ready(console, client, sidecar, deadline=time.monotonic() + 30)
            _step(
                console, "sidecar", f"{url} (pid {sidecar.pid}), ready in {time.monotonic() - started:.1f}s"
            )

            ledger = workdir / "acked.txt"
            args = ["--url", url, "--batch", "250", "--wait", "1", "--max-messages", str(messages)]
            args += ["--idle-exit", f"{WORKER_IDLE_EXIT_S:g}"]
            worker_proc = start_worker(workdir, worker, ledger, args)
            children.append(worker_proc)
            _step(
                console, "worker", f"{_show_path(worker)} (pid {worker_proc.pid}), pulling from the sidecar"
            )
            _step(
                console,
                "producer",
                f"{producers} concurrent batches of {batch} to POST /v1/publish/{TOPIC}/batch",
            )

            await _drive(console, client, outcome, sidecar, worker_proc, producers, batch, timeout_s)
            _read_ledger(ledger, outcome)
            outcome.worker_summary = worker_proc.last_line("worker done:")
            if sidecar.returncode is None:
                outcome.metrics = SidecarMetrics.parse(await client.metrics())
        for child in reversed(children):  # the worker (it may be exiting), then the sidecar (drains)
            code = child.stop(15.0, grace_s=2.0 if child is worker_proc else 0.0)
            if code != 0:
                outcome.failures.append(f"the {child.name} {_exit_text(code)}")
                outcome.logs[child.name] = child.log_tail()
    return outcome


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _step(console: Console, what: str, text: str) -> None:
    console.print(f"[green]✓[/] [bold]{what:<9}[/] {text}", highlight=False)


def _show_path(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(Path.cwd()))
    return str(path)


async def _create_topic(server: S3Server, partitions: int) -> tuple[str, str]:
    """A fresh bucket with the demo topic; returns the bucket and the put-if-absent strategy."""
    from bucketq import Bucketq

    settings = await asyncio.to_thread(server.settings)
    async with Bucketq(settings) as bq:
        await bq.create_topic(TOPIC, partitions=partitions)
        return settings.s3_bucket or "", bq.strategy


def _sidecar_env(server: S3Server, bucket: str, strategy: str, port: int, messages: int) -> dict[str, str]:
    return {
        "BUCKETQ_BACKEND": "s3",
        "BUCKETQ_S3_ENDPOINT_URL": server.endpoint_url,
        "BUCKETQ_S3_BUCKET": bucket,
        "BUCKETQ_S3_ACCESS_KEY_ID": server.access_key,
        "BUCKETQ_S3_SECRET_ACCESS_KEY": server.secret_key,
        "BUCKETQ_STRATEGY": strategy,
        "BUCKETQ_SIDECAR_CONSUMER": CONSUMER,
        "BUCKETQ_SIDECAR_TOPICS": TOPIC,
        "BUCKETQ_SIDECAR_LISTEN_PORT": str(port),
        "BUCKETQ_SIDECAR_METRICS_PORT": "0",  # /metrics on the API port only
        "BUCKETQ_SIDECAR_PUBLISH_BUFFER_SIZE": str(max(10_000, messages)),
        "BUCKETQ_SIDECAR_DRAIN_GRACE_S": "5",
    }


async def _wait_ready(console: Console, client: AsyncClient, sidecar: Child, deadline: float) -> None:
    while not await client.ready():
        code = sidecar.returncode
        if code is not None or time.monotonic() > deadline:
            console.print(sidecar.log_tail(), markup=False, style="dim", soft_wrap=True)
            why = "was not ready in time" if code is None else _exit_text(code)
            raise RuntimeError(f"the sidecar {why} (its log above)")
        await asyncio.sleep(POLL_S)


async def _drive(
    console: Console,
    client: AsyncClient,
    outcome: SidecarOutcome,
    sidecar: Child,
    worker: Child,
    producers: int,
    batch: int,
    timeout_s: float,
) -> None:
    """Publish while the worker consumes, with progress bars; returns when the worker has exited."""
    from rich.progress import Progress

    from bucketq.demo.common import progress_columns

    with Progress(*progress_columns(), console=console) as progress:
        published = progress.add_task("published", total=outcome.messages)
        acked = progress.add_task("acked by the worker", total=outcome.messages)
        shares = [range(i, outcome.messages, producers) for i in range(producers)]
        publishing = asyncio.gather(
            *(
                _publish(client, share, batch, outcome, lambda n: progress.advance(published, n))
                for share in shares
            )
        )
        try:
            await _watch(client, outcome, sidecar, worker, progress, acked, time.monotonic() + timeout_s)
        finally:
            publishing.cancel()
            (error,) = await asyncio.gather(publishing, return_exceptions=True)
        if isinstance(error, Exception):
            outcome.failures.append(f"the producer failed: {error!r}")


async def _publish(
    client: AsyncClient, ids: range, batch: int, outcome: SidecarOutcome, advance: Callable[[int], None]
) -> None:
    """Publish orders ``ids`` in batches; a full buffer (429) is retried, other errors are counted."""
    rng = random.Random(ids.start)
    for start in range(0, len(ids), batch):
        orders = ids[start : start + batch]
        msgs = [
            message({"id": i, "amount": round(rng.uniform(1, 500), 2)}, key=f"customer-{i % 97}")
            for i in orders
        ]
        if outcome.first_publish is None:
            outcome.first_publish = time.time()
        while True:
            try:
                result = await client.publish_batch(TOPIC, msgs)
            except Busy as exc:
                await asyncio.sleep(exc.retry_after or 0.2)
                continue
            except SidecarError:
                outcome.publish_errors += len(msgs)
                break
            for entry in result.results:
                if entry.result is not None:
                    outcome.published.add(entry.result.id)
                else:
                    outcome.publish_errors += 1
            break
        advance(len(orders))


async def _watch(
    client: AsyncClient,
    outcome: SidecarOutcome,
    sidecar: Child,
    worker: Child,
    progress: Progress,
    task: TaskID,
    deadline: float,
) -> None:
    """Follow the sidecar's acked counter until the worker exits (or a process dies, or time is up)."""
    while True:
        if sidecar.returncode is not None:  # reported once it is reaped
            return
        with contextlib.suppress(SidecarError):
            status = await client.status()
            progress.update(task, completed=status.get("counters", {}).get("acked", 0))
        if worker.returncode is not None:
            return
        if time.monotonic() > deadline:
            outcome.failures.append("timed out waiting for the worker")
            return
        await asyncio.sleep(POLL_S)


def _read_ledger(path: Path, outcome: SidecarOutcome) -> None:
    """The worker tap's ``<id> <unix time>`` lines: what the worker acked, and when the last ack was."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return
    for line in lines:
        message_id, _, when = line.partition(" ")
        outcome.acks[message_id] += 1
        outcome.last_ack = max(outcome.last_ack or 0.0, float(when))


def _stop_all(children: list[Child], timeout_s: float) -> None:
    for child in reversed(children):
        child.stop(timeout_s)


def summary_table(outcome: SidecarOutcome) -> Table:
    """The books and the sidecar's ``/metrics`` figures, as a two-column table."""

    from bucketq.demo.common import count, two_column_table

    m = outcome.metrics
    n = len(outcome.published)
    per_message = f"{m.s3_requests / n:.4f}" if m is not None and n else "–"
    rate = outcome.consumed / outcome.seconds if outcome.seconds > 0 else 0.0
    rows = [
        ("store", f"moto S3 server ({outcome.strategy})"),
        ("messages published", f"{n:,}"),
        ("consumed (acked by the worker)", f"{outcome.consumed:,}"),
        ("first publish → last ack", f"{outcome.seconds:.1f}s"),
        ("msgs/s", f"{rate:,.0f}"),
        ("duplicates", count(outcome.duplicates)),
        ("lost", count(outcome.lost)),
        ("S3 requests per message", per_message),
    ]
    if outcome.publish_errors:
        rows.append(("publish errors", count(outcome.publish_errors)))
    table = two_column_table("bucketq demo (sidecar mode)", rows)
    table.add_section()
    if m is None:
        table.add_row("[dim]sidecar /metrics[/]", "[red]unavailable: the sidecar was gone[/]")
        return table
    table.add_row("[dim]sidecar /metrics[/]", "")
    metric_rows = [
        ("published", m["messages_published"]),
        ("delivered", m["messages_delivered"]),
        ("redelivered", m["messages_redelivered"]),
        ("acked", m["messages_acked"]),
        ("commit conflicts (412)", m["commit_conflicts"]),
        ("S3 requests", m.s3_requests),
    ]
    for label, number in metric_rows:
        table.add_row(label, f"{number:,}")
    for op, number in sorted(m.s3_by_op.items(), key=lambda kv: (-kv[1], kv[0])):
        table.add_row(f"  {op}", f"{number:,}", style="dim")
    if m.s3_failures:
        table.add_row("S3 errors and timeouts", count(m.s3_failures))
    return table
