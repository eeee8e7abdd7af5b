"""The rich tables of a bench run: every run, where its requests went, and the bills (cost, idle)."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from bucketq.bench.report import RunResult


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _usd(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


def _table(title: str) -> Table:
    return Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)


def label(r: RunResult) -> str:
    """The row name of a run: its scenario, the rate of a ``cost`` run, the system (and the
    sidecar's delivery) of a ``one-at-a-time`` run."""
    rate = r.extra.get("rate")
    if r.scenario == "cost" and rate is not None:
        return f"{r.scenario} {rate:g}/s"
    if r.scenario == "one-at-a-time":
        system = str(r.extra.get("system", ""))
        variant = str(r.extra.get("variant", ""))
        if r.via == "sidecar":
            system += " push" if variant.startswith("sidecar (push)") else " pull"
        return f"one-at-a-time {system}"
    return r.scenario


def counted_requests(r: RunResult) -> int:
    """The run's requests as counted where its price was (the server when it counted)."""
    return r.server_requests if r.counted_at == "server" and r.server_requests is not None else r.s3_requests


def _top(counts: dict[str, Any], n: int, fmt: str) -> str:
    return ", ".join(f"{k}: {v:{fmt}}" for k, v in list(counts.items())[:n])


def _bad(r: RunResult) -> bool:
    return bool(r.duplicates or r.lost or not r.completed)


def results_table(results: list[RunResult]) -> Table:
    first = results[0] if results else None
    title = "bucketq bench"
    if first is not None:
        title += (
            f" on {first.backend}: {max(r.producers for r in results)} producers, "
            f"{max(r.consumers for r in results)} consumers, {first.partitions} partitions, "
            f"{first.payload_bytes} B payloads, profile {first.profile or 'default'}"
        )
    table = _table(title)
    table.padding = (0, 1, 0, 0)  # right padding only: the table fits 80 columns
    names = ("scenario", "msgs", "msgs/s", "req/msg", "$/M", "p50 ms", "p99 ms", "dup", "lost", "s")
    for name in names:
        table.add_column(name, justify="left" if name == "scenario" else "right", no_wrap=True)
    for r in results:
        per_message = r.messages > 0 and r.sqs_usd_per_million_messages is not None  # not for idle
        table.add_row(
            label(r),
            f"{r.messages:,}",
            _fmt(r.msgs_per_s) if per_message else "-",
            f"{counted_requests(r) / r.messages:.4f}" if per_message else "-",
            _usd(r.usd_per_million_messages),
            _fmt(r.p50_ms),
            _fmt(r.p99_ms),
            f"[red]{r.duplicates}[/]" if r.duplicates else "0",
            f"[red]{r.lost}[/]" if r.lost else "0",
            _fmt(r.seconds, 2),
            style="red" if _bad(r) else None,
        )
    table.caption = "$/M: USD per million messages at S3 list prices"
    if any(r.counted_at == "server" for r in results):
        table.caption += "; req/msg and $ from the server's request counts (see 'requests')"
    return table


def requests_table(results: list[RunResult]) -> Table:
    """Where the requests went: client and server totals, and calls per operation and kind of object."""
    table = Table(title="requests", header_style="bold", box=box.SIMPLE_HEAD)
    table.add_column("scenario", no_wrap=True)
    table.add_column("client", justify="right", no_wrap=True)
    table.add_column("server", justify="right", no_wrap=True)
    table.add_column("counted at", no_wrap=True)
    table.add_column("MB moved", justify="right", no_wrap=True)
    table.add_column("calls (op object: count, as counted)")
    for r in results:
        calls = (
            r.server_calls_by_key if r.counted_at == "server" and r.server_calls_by_key else r.calls_by_key
        )
        table.add_row(
            label(r),
            f"{r.s3_requests:,}",
            "-" if r.server_requests is None else f"{r.server_requests:,}",
            r.counted_at,
            f"{r.bytes_moved / 1e6:.2f}",
            ", ".join(f"{k}: {v:,}" for k, v in calls.items()),
        )
    return table


def cost_table(results: list[RunResult]) -> Table:
    """The ``cost`` runs: per publish rate, requests and list price per message, SQS beside it."""
    table = _table("cost per message at each publish rate (S3 list prices)")
    for name in ("rate", "msgs", "msgs/s", "req/msg", "$/M msgs", "SQS $/M", "p50 ms", "p99 ms", "dup/lost"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("req/msg by kind", ratio=1)
    for r in results:
        table.add_row(
            f"{r.extra.get('rate', 0):g}/s",
            f"{r.messages:,}",
            _fmt(r.msgs_per_s),
            f"{counted_requests(r) / r.messages:.3f}" if r.messages else "-",
            _usd(r.usd_per_million_messages),
            _usd(r.sqs_usd_per_million_messages),
            _fmt(r.p50_ms),
            _fmt(r.p99_ms),
            f"{r.duplicates}/{r.lost}",
            _top(r.extra.get("requests_per_message_by_key", {}), 5, ".3f"),
            style="red" if _bad(r) else None,
        )
    return table


def idle_table(r: RunResult) -> Table:
    """An ``idle`` run: each measured phase's request rate and monthly price, and the pickups."""
    table = _table(f"idle consumers ({r.profile or 'default'} profile, S3 list prices, 30-day month)")
    table.add_column("phase", ratio=1)
    for name in ("s", "req/min", "$/month", "$/mo/member", "SQS $/mo"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("req/min by kind", ratio=2)
    sqs = r.extra.get("sqs_usd_per_idle_month")
    for phase in r.extra.get("phases", []):
        table.add_row(
            phase["phase"],
            _fmt(phase["seconds"]),
            _fmt(phase["requests_per_min"], 2),
            _usd(phase["usd_per_month"]),
            _usd(phase["usd_per_month_per_member"]),
            _usd(sqs),
            _top(phase["requests_per_min_by_key"], 5, ".2f"),
        )
    inc = r.extra.get("member_increment")
    if inc is not None:
        month = inc["usd_per_month"]
        table.add_row(
            "one more member (increment)",
            "",
            _fmt(inc["requests_per_min"], 2),
            "",
            _usd(month) if month >= 0 else f"-{_usd(-month)}",
            _usd(sqs),
            _top(inc["requests_per_min_by_key"], 5, "+.2f"),
        )
    pickups = r.extra.get("pickups", {})
    table.caption = (
        f"pickup of a message after {pickups.get('silence_s', 0):g}s of silence "
        f"({pickups.get('handled', 0)}/{pickups.get('count', 0)} handled): "
        f"p50 {_fmt(r.p50_ms)} ms, p99 {_fmt(r.p99_ms)} ms; requests counted at the {r.counted_at}"
    )
    if _bad(r):
        table.style = "red"
    return table


def print_results(results: list[RunResult], console: Console, *, details: bool = True) -> None:
    console.print(results_table(results))
    if details:
        console.print(requests_table(results))
    costs = [r for r in results if r.scenario == "cost"]
    if costs:
        console.print(cost_table(costs))
    for r in results:
        if r.scenario == "idle":
            console.print(idle_table(r))
