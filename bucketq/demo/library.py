"""``bucketq demo --mode library``: the engine in-process on an embedded S3 (moto) or a directory.

Creates a topic, publishes a few thousand messages from concurrent producers while several
consumers consume and ack them, and prints what it cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID
    from rich.table import Table

    from bucketq.bench.backends import Backend, Usage
    from bucketq.bench.tracker import Tracker
    from bucketq.bench.workers import ProgressFn

TOPIC = "demo"
GROUP = "demo-workers"


@dataclass
class DemoOutcome:
    messages: int
    seconds: float
    usage: Usage
    tracker: Tracker
    completed: bool
    strategy: str

    @property
    def ok(self) -> bool:
        return self.completed and not self.tracker.duplicates and not self.tracker.lost


async def run_demo(
    backend: Backend,
    *,
    messages: int,
    producers: int,
    consumers: int,
    partitions: int,
    progress: Progress | None = None,
    idle_timeout_s: float = 30.0,
) -> DemoOutcome:
    """Publish ``messages`` from ``producers`` while ``consumers`` consume them; count everything."""
    from bucketq.bench.fleet import open_fleet
    from bucketq.bench.tracker import Tracker
    from bucketq.bench.workers import produce

    fleet = await open_fleet(backend, TOPIC, partitions, group=GROUP)
    try:
        await fleet.add_producers(producers)
        await fleet.add_consumers(consumers)
        tracker = Tracker(expected=messages)
        published, acked = _progress_tasks(progress, messages)
        fleet.start_consuming(tracker, 500, on_ack=acked)
        sending = asyncio.gather(
            *(
                produce(
                    p,
                    TOPIC,
                    range(i, messages, producers),
                    tracker,
                    payload_bytes=200,
                    window=500,
                    on_publish=published,
                )
                for i, p in enumerate(fleet.producers)
            )
        )
        completed, _ = await fleet.wait(tracker, idle_timeout_s)
        usage = fleet.run.usage()
        await sending
        seconds = (tracker.last_ack or time.perf_counter()) - (tracker.first_publish or 0.0)
        await fleet.finish(0.3)
        return DemoOutcome(messages, seconds, usage, tracker, completed, fleet.strategy)
    finally:
        await fleet.run.close()


def _progress_tasks(progress: Progress | None, total: int) -> tuple[ProgressFn | None, ProgressFn | None]:
    if progress is None:
        return None, None
    pub: TaskID = progress.add_task("published", total=total)
    ack: TaskID = progress.add_task("consumed and acked", total=total)
    return (lambda: progress.advance(pub)), (lambda: progress.advance(ack))


def summary_table(
    outcome: DemoOutcome, backend: str, producers: int, consumers: int, partitions: int
) -> Table:

    from bucketq.demo.common import count, two_column_table

    t = outcome.tracker
    rate = outcome.messages / outcome.seconds if outcome.seconds > 0 else 0.0
    per_msg = outcome.usage.total / outcome.messages if outcome.messages else 0.0
    rows = [
        ("store", f"{backend} ({outcome.strategy})"),
        ("producers / consumers / partitions", f"{producers} / {consumers} / {partitions}"),
        ("messages", f"{outcome.messages:,}"),
        ("acked", f"{t.acked:,}"),
        ("msgs/s", f"{rate:,.0f}"),
        ("S3 requests", f"{outcome.usage.total:,}"),
        ("S3 requests per message", f"{per_msg:.4f}"),
        ("bytes moved", f"{(outcome.usage.bytes_in + outcome.usage.bytes_out) / 1e6:.2f} MB"),
        ("duplicates", count(t.duplicates)),
        ("lost", count(t.lost)),
    ]
    return two_column_table("bucketq demo (library mode)", rows)


async def run_library_demo(
    console: Console, backend: str, messages: int, producers: int, consumers: int, partitions: int
) -> DemoOutcome:
    """The library-mode demo with live progress on ``console``, ending with the summary table."""
    from rich.progress import Progress

    from bucketq.bench.backends import open_backend
    from bucketq.demo.common import progress_columns

    with contextlib.ExitStack() as stack:
        with console.status(
            f"starting {'a moto S3 server' if backend == 'moto' else 'a local directory store'}…"
        ):
            running = stack.enter_context(open_backend("moto" if backend == "moto" else "file"))
        console.print(f"store ready: {_where(running)}")
        with Progress(*progress_columns(), console=console) as progress:
            outcome = await run_demo(
                running,
                messages=messages,
                producers=producers,
                consumers=consumers,
                partitions=partitions,
                progress=progress,
            )
    console.print(summary_table(outcome, backend, producers, consumers, partitions))
    return outcome


def _where(backend: Backend) -> str:
    if backend.server is not None:
        return f"moto S3 server at {backend.server.endpoint_url}"
    return f"directory {backend.workdir}"
