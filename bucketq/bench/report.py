"""Bench results: one record per run, the JSON file, and the rich table."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from bucketq.bench.backends import Usage
from bucketq.bench.tracker import Tracker, percentile


@dataclass
class RunResult:
    """One scenario on one backend. ``s3_requests`` counts requests on the wire, retries included."""

    scenario: str
    backend: str
    messages: int
    producers: int
    consumers: int
    partitions: int
    payload_bytes: int
    msgs_per_s: float
    seconds: float
    s3_requests: int
    s3_requests_per_message: float
    requests_by_op: dict[str, int]
    calls_by_key: dict[str, int]
    bytes_moved: int
    bytes_out: int
    bytes_in: int
    p50_ms: float | None
    p99_ms: float | None
    latency: str
    duplicates: int
    lost: int
    published: int
    acked: int
    publish_errors: int
    ack_errors: int
    setup_requests: int
    cpu_s: float
    completed: bool
    strategy: str
    via: str = "library"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


def build_result(
    *,
    scenario: str,
    backend: str,
    messages: int,
    producers: int,
    consumers: int,
    partitions: int,
    payload_bytes: int,
    seconds: float,
    usage: Usage,
    setup: Usage,
    latencies: list[float],
    latency: str,
    tracker: Tracker,
    duplicates: int,
    lost: int,
    cpu_s: float,
    completed: bool,
    strategy: str,
    extra: dict[str, Any] | None = None,
) -> RunResult:
    """Assemble a :class:`RunResult` from what a scenario measured."""
    total = usage.total
    return RunResult(
        scenario=scenario,
        backend=backend,
        messages=messages,
        producers=producers,
        consumers=consumers,
        partitions=partitions,
        payload_bytes=payload_bytes,
        msgs_per_s=round(messages / seconds, 1) if seconds > 0 else 0.0,
        seconds=round(seconds, 3),
        s3_requests=total,
        s3_requests_per_message=round(total / messages, 4) if messages else 0.0,
        requests_by_op=dict(sorted(usage.requests.items())),
        calls_by_key=dict(usage.calls.most_common()),
        bytes_moved=usage.bytes_in + usage.bytes_out,
        bytes_out=usage.bytes_out,
        bytes_in=usage.bytes_in,
        p50_ms=_ms(percentile(latencies, 50)),
        p99_ms=_ms(percentile(latencies, 99)),
        latency=latency,
        duplicates=duplicates,
        lost=lost,
        published=len(tracker.published),
        acked=tracker.acked,
        publish_errors=tracker.publish_errors,
        ack_errors=tracker.ack_errors,
        setup_requests=setup.total,
        cpu_s=round(cpu_s, 2),
        completed=completed,
        strategy=strategy,
        extra=extra or {},
    )


def write_json(results: list[RunResult], path: Path) -> None:
    path.write_text(json.dumps([r.to_json() for r in results], indent=2) + "\n")


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def results_table(results: list[RunResult]) -> Table:
    first = results[0] if results else None
    title = "bucketq bench"
    if first is not None:
        title += (
            f" on {first.backend}: {max(r.producers for r in results)} producers, "
            f"{max(r.consumers for r in results)} consumers, {first.partitions} partitions, "
            f"{first.payload_bytes} B payloads"
        )
    table = Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for name in ("scenario", "msgs", "msgs/s", "req/msg", "p50 ms", "p99 ms", "dup", "lost", "s"):
        table.add_column(name, justify="left" if name == "scenario" else "right", no_wrap=True)
    for r in results:
        bad = r.duplicates or r.lost or not r.completed
        table.add_row(
            r.scenario,
            f"{r.messages:,}",
            _fmt(r.msgs_per_s),
            f"{r.s3_requests_per_message:.4f}",
            _fmt(r.p50_ms),
            _fmt(r.p99_ms),
            f"[red]{r.duplicates}[/]" if r.duplicates else "0",
            f"[red]{r.lost}[/]" if r.lost else "0",
            _fmt(r.seconds, 2),
            style="red" if bad else None,
        )
    return table


def requests_table(results: list[RunResult]) -> Table:
    """Where the requests went: totals, and calls per operation and kind of object, per run."""
    table = Table(title="requests", header_style="bold", box=box.SIMPLE_HEAD)
    table.add_column("scenario", no_wrap=True)
    table.add_column("requests", justify="right", no_wrap=True)
    table.add_column("MB moved", justify="right", no_wrap=True)
    table.add_column("calls (op object: count)")
    for r in results:
        parts = [f"{k}: {v:,}" for k, v in r.calls_by_key.items()]
        table.add_row(r.scenario, f"{r.s3_requests:,}", f"{r.bytes_moved / 1e6:.2f}", ", ".join(parts))
    return table


def print_results(results: list[RunResult], console: Console, *, details: bool = True) -> None:
    console.print(results_table(results))
    if details:
        console.print(requests_table(results))
