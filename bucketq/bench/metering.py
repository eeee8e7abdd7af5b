"""What a window of a run cost: requests counted by the client and, on moto, by the server; CPU.

A :class:`Meter` takes :class:`Mark` s (client counts, access-log offset, time) and
:meth:`Meter.between` two of them gives the window's :class:`Counted`: the client's counts (the
metered connections of the run, :class:`bucketq.bench.backends.Usage`) and the server's
(:class:`bucketq.bench.accesslog.ServerCounts`, requests to the run's bucket from any connection).
Prices use the server's counts when there are some: they are what S3 would bill.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from bucketq.bench.accesslog import AccessLog, ServerCounts
from bucketq.bench.backends import Backend, RunBucket, Usage
from bucketq.bench.pricing import usd

CountedAt = Literal["server", "client"]


@dataclass(frozen=True)
class Mark:
    """A point of a run: cumulative client counts, access-log offset (None: no server log), time."""

    usage: Usage
    log_offset: int | None
    at: float


@dataclass(frozen=True)
class Counted:
    """The requests of one window, as the client and (when available) the server counted them."""

    client: Usage
    server: ServerCounts | None
    seconds: float

    @property
    def counted_at(self) -> CountedAt:
        return "server" if self.server is not None else "client"

    @property
    def by_op(self) -> Counter[str]:
        """Requests by operation, from the server when it counted."""
        return Counter(self.server.by_op) if self.server is not None else Counter(self.client.requests)

    @property
    def calls(self) -> Counter[str]:
        """Requests by ``"OP kind"``, from the server when it counted (else the engine's calls)."""
        return Counter(self.server.calls) if self.server is not None else Counter(self.client.calls)

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    @property
    def usd(self) -> float:
        """List price of the window's requests."""
        return usd(self.by_op)

    def __add__(self, other: Counted) -> Counted:
        server = None
        if self.server is not None and other.server is not None:
            server = self.server + other.server
        return Counted(_add_usage(self.client, other.client), server, self.seconds + other.seconds)


def _add_usage(a: Usage, b: Usage) -> Usage:
    return Usage(
        a.requests + b.requests, a.calls + b.calls, a.bytes_in + b.bytes_in, a.bytes_out + b.bytes_out
    )


def _sub_usage(end: Usage, start: Usage) -> Usage:
    return Usage(
        end.requests - start.requests,
        end.calls - start.calls,
        end.bytes_in - start.bytes_in,
        end.bytes_out - start.bytes_out,
    )


def server_log(backend: Backend) -> AccessLog | None:
    """The access log of the backend's server when requests can be counted there (moto only)."""
    if backend.server is None or backend.server.name != "moto":
        return None
    return AccessLog(backend.server.log_path)


class Meter:
    """Marks points of one run's bucket and counts the requests between them."""

    def __init__(self, backend: Backend, run: RunBucket) -> None:
        self.run = run
        self.bucket = run.settings.s3_bucket
        self.log = server_log(backend) if self.bucket else None

    def mark(self) -> Mark:
        offset = self.log.mark() if self.log is not None else None
        return Mark(self.run.usage(), offset, time.perf_counter())

    def between(self, start: Mark, end: Mark) -> Counted:
        server = None
        if self.log is not None and start.log_offset is not None and end.log_offset is not None:
            assert self.bucket is not None  # a log is only kept for a bucket
            server = self.log.count(start.log_offset, end.log_offset, self.bucket)
        return Counted(_sub_usage(end.usage, start.usage), server, end.at - start.at)


class CpuMeter:
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


def per_message(counts: Mapping[str, int], messages: int) -> dict[str, float]:
    """Counts divided by ``messages`` (rounded), largest first."""
    items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return {k: round(v / messages, 4) for k, v in items} if messages else {}


def window_counts(window: Counted, messages: int) -> dict[str, Any]:
    """A measured window's length and its requests per message, in total and by ``"OP kind"``."""
    return {
        "window_s": round(window.seconds, 3),
        "window_requests_per_message": round(window.total / messages, 4) if messages else None,
        "window_requests_per_message_by_key": per_message(window.calls, messages),
    }
