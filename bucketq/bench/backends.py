"""Where a run's bucket lives (a local S3 server, a temp directory, memory) and its metered connections."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bucketq import Bucketq, Settings
from bucketq.bench.metered import MeteredStore
from bucketq.bench.served import ServedStore
from bucketq.bench.servers import S3Server, serve
from bucketq.storage import MemoryStore, ObjectStore, RequestStats
from bucketq.storage.strategies import build_store

BackendName = Literal["moto", "seaweedfs", "file", "memory"]
BACKENDS: tuple[BackendName, ...] = ("moto", "seaweedfs", "file", "memory")


@dataclass
class Backend:
    """Makes a fresh, empty bucket per run on one kind of store."""

    name: BackendName
    server: S3Server | None = None
    workdir: Path | None = None
    tuning: dict[str, Any] = field(default_factory=dict)
    service_ms: float | None = None  # memory only: served one request at a time (bench/served.py)
    service_servers: int = 1  # ... or this many at a time

    @property
    def label(self) -> str:
        """The backend as results name it: ``memory@4ms`` for the served model (``memory@4msx4``
        served four requests at a time)."""
        if self.service_ms is None:
            return self.name
        servers = "" if self.service_servers == 1 else f"x{self.service_servers}"
        return f"{self.name}@{self.service_ms:g}ms{servers}"

    def server_cpu_s(self) -> float | None:
        """CPU seconds the server process has used so far (Linux), or None."""
        if self.server is None:
            return None
        return process_cpu_s(self.server.process.pid)

    def fresh(self) -> RunBucket:
        """A new empty bucket (S3 bucket, directory, or in-memory store) for one run."""
        data: dict[str, Any]
        shared: ObjectStore | None = None
        if self.server is not None:
            data = self.server.settings_dict("auto")
        elif self.name == "file":
            assert self.workdir is not None
            data = {"backend": "file", "file_path": str(self.workdir / f"run-{uuid.uuid4().hex[:8]}")}
        else:
            data = {"backend": "memory"}
            shared = MemoryStore()
            if self.service_ms is not None:
                shared = ServedStore(shared, self.service_ms / 1000, self.service_servers)
        data.update(self.tuning)
        return RunBucket(Settings.from_dict(data), shared)


def process_cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds of process ``pid`` from ``/proc`` (None where unavailable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / ticks


@contextlib.contextmanager
def open_backend(
    name: BackendName,
    tuning: dict[str, Any] | None = None,
    service_ms: float | None = None,
    service_servers: int = 1,
) -> Iterator[Backend]:
    """Start what the backend needs (an S3 server process or a temp directory) for the ``with`` block.

    ``service_ms`` (memory only) serves the in-memory store like a local S3 server, answering
    ``service_servers`` requests at a time.
    """
    tuning = tuning or {}
    if service_ms is not None and name != "memory":
        raise ValueError(f"a service time models a server on the memory backend, not on {name}")
    if name in ("moto", "seaweedfs"):
        with serve(name) as server:
            yield Backend(name, server=server, tuning=tuning)
    elif name == "file":
        with tempfile.TemporaryDirectory(prefix="bucketq-bench-") as tmp:
            yield Backend(name, workdir=Path(tmp), tuning=tuning)
    elif name == "memory":
        yield Backend(name, tuning=tuning, service_ms=service_ms, service_servers=service_servers)
    else:
        raise ValueError(f"unknown backend {name!r}: use one of {', '.join(BACKENDS)}")


@dataclass
class Usage:
    """Store traffic of a set of connections."""

    requests: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)
    bytes_in: int = 0
    bytes_out: int = 0

    @property
    def total(self) -> int:
        return sum(self.requests.values())


class RunBucket:
    """One run's bucket and the connections to it; counts the traffic of the connections it opened."""

    def __init__(self, settings: Settings, shared: ObjectStore | None = None) -> None:
        self.settings = settings
        self._shared = shared
        self._metered: list[MeteredStore] = []
        self._baselines: dict[int, tuple[RequestStats, Counter[str], int, int]] = {}
        self._open: list[Bucketq] = []

    async def connect(self, *, metered: bool = True) -> Bucketq:
        """Open a new connection (its own client, or the shared in-memory store)."""
        inner = self._shared if self._shared is not None else build_store(self.settings)
        store = MeteredStore(inner)
        if metered:
            stats = inner.stats
            if id(stats) not in self._baselines:  # a shared store may have served earlier, unmetered work
                self._baselines[id(stats)] = (stats, Counter(stats.requests), stats.bytes_in, stats.bytes_out)
            self._metered.append(store)
        bq = Bucketq(self.settings, store=store)
        self._open.append(bq)
        try:
            await bq.open()
        except BaseException:
            self._open.remove(bq)
            await bq.close()
            raise
        return bq

    def usage(self) -> Usage:
        """Traffic of the metered connections since they were opened."""
        out = Usage()
        for stats, requests, bytes_in, bytes_out in self._baselines.values():
            out.requests.update(Counter(stats.requests) - requests)
            out.bytes_in += stats.bytes_in - bytes_in
            out.bytes_out += stats.bytes_out - bytes_out
        for store in self._metered:
            out.calls.update(store.calls)
        return out

    async def close(self, bq: Bucketq | None = None) -> None:
        """Close one connection, or all still open."""
        targets = [bq] if bq is not None else list(reversed(self._open))
        for conn in targets:
            if conn in self._open:
                self._open.remove(conn)
                await conn.close()
