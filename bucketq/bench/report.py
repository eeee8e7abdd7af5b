"""Bench results: one record per run and the JSON file (the tables: :mod:`bucketq.bench.tables`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bucketq.bench.accesslog import ServerCounts
from bucketq.bench.backends import Usage
from bucketq.bench.pricing import SQS_USD_PER_MILLION_MESSAGES, usd
from bucketq.bench.tracker import Tracker, percentile


@dataclass
class RunResult:
    """One scenario on one backend.

    ``s3_requests`` and ``requests_by_op`` are the client's count of requests on the wire (retries
    included), ``calls_by_key`` the engine's calls; ``server_*`` the same requests as the server
    logged them (moto only, else None). ``usd`` is their list price, from the server's counts when
    ``counted_at`` is ``"server"``, else from the client's.
    """

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
    profile: str | None = None  # the engine's Settings.profile the run used
    counted_at: str = "client"
    server_requests: int | None = None
    server_requests_by_op: dict[str, int] | None = None
    server_requests_by_method: dict[str, int] | None = None
    server_calls_by_key: dict[str, int] | None = None
    # requests per message as counted where they were priced (the server when it counted)
    requests_per_message: float | None = None
    usd: float = 0.0
    usd_per_million_messages: float | None = None
    sqs_usd_per_million_messages: float | None = None
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
    server: ServerCounts | None = None,
    profile: str | None = None,
    via: str = "library",
    per_message: bool = True,
) -> RunResult:
    """Assemble a :class:`RunResult` from what a scenario measured.

    ``server``: the server's count of the same requests as ``usage`` (None where it cannot count);
    ``per_message``: whether a price per message means anything (not for an idle queue).
    """
    total = usage.total
    price = usd(server.by_op if server is not None else usage.requests)
    counted = server.total if server is not None else total
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
        via=via,
        profile=profile,
        counted_at="server" if server is not None else "client",
        server_requests=server.total if server is not None else None,
        server_requests_by_op=dict(sorted(server.by_op.items())) if server is not None else None,
        server_requests_by_method=dict(sorted(server.by_method.items())) if server is not None else None,
        server_calls_by_key=dict(server.calls.most_common()) if server is not None else None,
        requests_per_message=round(counted / messages, 4) if per_message and messages else None,
        usd=price,
        usd_per_million_messages=price / messages * 1e6 if per_message and messages else None,
        sqs_usd_per_million_messages=SQS_USD_PER_MILLION_MESSAGES if per_message else None,
        extra=extra or {},
    )


def write_json(results: list[RunResult], path: Path) -> None:
    path.write_text(json.dumps([r.to_json() for r in results], indent=2) + "\n")
