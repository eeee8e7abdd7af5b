"""``bucketq bench --via sidecar``: apps talking HTTP to sidecar processes, end to end.

:func:`run_via_sidecar` starts N sidecar processes against an S3 endpoint, publishes through them
over HTTP (batches) while HTTP pull workers consume and ack, and reports throughput, S3 requests per
message (from each sidecar's ``bucketq_s3_requests_total``), latency, duplicates, losses and the
sidecars' peak RSS (``VmRSS`` from ``/proc``).

Delivery bookkeeping is the library bench's :class:`~bucketq.bench.tracker.Tracker` and processes
are started with :mod:`bucketq.bench.servers`, so both benchmarks count and launch the same way.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

import bucketq
from bucketq.bench.servers import ACCESS_KEY, SECRET_KEY, free_ports, launch, stop_process, wait_http
from bucketq.bench.tracker import Tracker, percentile
from bucketq.client import AsyncClient, SidecarError, message
from bucketq.config import Settings
from bucketq.core.app import Bucketq

PUBLISH_BATCH = 250
PULL_BATCH = 500
WORKERS_PER_SIDECAR = 2
PUBLISHERS_PER_SIDECAR = 2
READY_TIMEOUT_S = 60.0
# Longer than BUCKETQ_SIDECAR_DRAIN_GRACE_S below: a sidecar may finish draining before it is killed.
STOP_TIMEOUT_S = 30.0


@dataclass
class _Sidecar:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    rss_peak_kib: int = 0


@dataclass
class _Peaks:
    """What the sampler saw besides RSS: leases held by all sidecars at once."""

    leases: int = 0


async def run_via_sidecar(
    endpoint_url: str,
    bucket: str,
    messages: int,
    sidecars: int,
    partitions: int,
    payload_bytes: int,
    *,
    access_key: str | None = None,
    secret_key: str | None = None,
    engine_env: Mapping[str, str] | None = None,
    max_in_flight: int | None = None,
    timeout_s: float = 300.0,
    hold_phase: bool = True,
) -> dict[str, Any]:
    """Run the end-to-end scenario through ``sidecars`` sidecar processes; returns the JSON record.

    ``engine_env`` adds ``BUCKETQ_*`` engine settings to the sidecars' environment;
    ``max_in_flight`` (per sidecar) defaults to ``messages``: however partitions fall to sidecars,
    all messages can be in flight at once.
    With ``hold_phase``, a second batch of ``messages`` is then published and held unacked by the
    app, to read the sidecars' RSS with all of them in flight (``rss_mib_at_in_flight``).
    """
    key = access_key or os.environ.get("BUCKETQ_S3_ACCESS_KEY_ID") or ACCESS_KEY
    secret = secret_key or os.environ.get("BUCKETQ_S3_SECRET_ACCESS_KEY") or SECRET_KEY
    settings = Settings.from_dict(
        {
            "backend": "s3",
            "s3_endpoint_url": endpoint_url,
            "s3_bucket": bucket,
            "s3_access_key_id": key,
            "s3_secret_access_key": secret,
        }
    )
    topic = f"bench-e2e-{uuid.uuid4().hex[:8]}"
    async with Bucketq(settings) as bq:
        await bq.create_topic(topic, partitions=partitions)
        strategy = bq.strategy
    in_flight = max_in_flight or messages  # any one sidecar may hold them all (hold phase)
    env = {
        "BUCKETQ_BACKEND": "s3",
        "BUCKETQ_S3_ENDPOINT_URL": endpoint_url,
        "BUCKETQ_S3_BUCKET": bucket,
        "BUCKETQ_S3_ACCESS_KEY_ID": key,
        "BUCKETQ_S3_SECRET_ACCESS_KEY": secret,
        "BUCKETQ_STRATEGY": strategy,
        "BUCKETQ_SIDECAR_CONSUMER": "bench",
        "BUCKETQ_SIDECAR_TOPICS": topic,
        "BUCKETQ_SIDECAR_MAX_IN_FLIGHT": str(in_flight),
        "BUCKETQ_SIDECAR_METRICS_PORT": "0",
        "BUCKETQ_SIDECAR_PUBLISH_BUFFER_SIZE": str(max(10_000, messages)),
        "BUCKETQ_SIDECAR_DRAIN_GRACE_S": "5",
        **(engine_env or {}),
    }
    workdir = Path(tempfile.mkdtemp(prefix="bucketq-bench-sidecar-"))
    procs = [_start(workdir, i, env) for i in range(sidecars)]
    sampler: asyncio.Task[None] | None = None
    try:
        await asyncio.gather(*(asyncio.to_thread(_wait_ready, sc) for sc in procs))
        baseline = sum(
            await asyncio.gather(*(asyncio.to_thread(_s3_requests, sc) for sc in procs)), Counter()
        )
        run = Tracker(expected=messages)
        peaks = _Peaks()
        sampler = asyncio.get_running_loop().create_task(_sample(procs, peaks))
        started = time.perf_counter()
        completed = await _drive(procs, topic, messages, payload_bytes, run, timeout_s)
        seconds = (run.last_ack or time.perf_counter()) - (run.first_publish or started)
        after = sum(await asyncio.gather(*(asyncio.to_thread(_s3_requests, sc) for sc in procs)), Counter())
        held = await _hold(procs, topic, messages, payload_bytes, timeout_s) if hold_phase else None
    finally:
        if sampler is not None:
            sampler.cancel()
        await asyncio.gather(*(asyncio.to_thread(_stop, sc) for sc in procs))
    requests = after - baseline
    total = sum(requests.values())
    acked = run.acked
    rss = [round(sc.rss_peak_kib / 1024, 1) for sc in procs]
    return {
        "scenario": "e2e",
        "via": "sidecar",
        "backend": endpoint_url,
        "strategy": strategy,
        "messages": messages,
        "sidecars": sidecars,
        "partitions": partitions,
        "payload_bytes": payload_bytes,
        "max_in_flight_per_sidecar": in_flight,
        "completed": completed,
        "seconds": round(seconds, 3),
        "msgs_per_s": round(acked / seconds, 1) if seconds > 0 else 0.0,
        "s3_requests": total,
        "s3_requests_per_message": round(total / max(1, acked), 4),
        "requests_by_op": dict(sorted(requests.items())),
        "p50_ms": _percentile_ms(run.receive_latencies, 50),
        "p99_ms": _percentile_ms(run.receive_latencies, 99),
        "duplicates": run.duplicates,
        "lost": run.lost,
        "published": len(run.published),
        "acked": acked,
        "publish_errors": run.publish_errors,
        "ack_errors": run.ack_errors,
        "leases_held_peak": peaks.leases,
        "rss_peak_mib": max(rss) if rss else 0.0,
        "rss_peak_mib_by_sidecar": rss,
        **(held or {}),
    }


# -- the workload ----------------------------------------------------------------------------------


async def _drive(
    procs: list[_Sidecar], topic: str, messages: int, payload_bytes: int, run: Tracker, timeout_s: float
) -> bool:
    """Publish ``messages`` spread over the sidecars while pull workers drain them; True if all acked."""
    pad = "x" * payload_bytes
    publishers = len(procs) * PUBLISHERS_PER_SIDECAR
    shares = [messages // publishers + (1 if i < messages % publishers else 0) for i in range(publishers)]
    clients = [AsyncClient(sc.url, timeout=60) for sc in procs]
    try:
        tasks = [
            asyncio.create_task(_publisher(clients[i % len(procs)], topic, share, pad, run))
            for i, share in enumerate(shares)
        ]
        tasks += [
            asyncio.create_task(_worker(client, run))
            for client in clients
            for _ in range(WORKERS_PER_SIDECAR)
        ]
        try:
            await asyncio.wait_for(run.done.wait(), timeout_s)
        except TimeoutError:
            run.done.set()  # workers stop after acking what they hold
        _, stuck = await asyncio.wait(tasks, timeout=10)
        for task in stuck:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await asyncio.gather(*(c.close() for c in clients))
    return run.acked >= messages


async def _hold(
    procs: list[_Sidecar], topic: str, messages: int, payload_bytes: int, timeout_s: float
) -> dict[str, Any]:
    """Publish ``messages`` and keep them all in flight (pulled, unacked); RSS then; then ack all."""
    run = Tracker(expected=messages)  # only publishing is tracked: the acks come all at once, below
    clients = [AsyncClient(sc.url, timeout=60) for sc in procs]
    pad = "x" * payload_bytes
    held: list[dict[str, str]] = [{} for _ in procs]  # per sidecar: message id -> latest receipt
    try:
        shares = [messages // len(procs) + (1 if i < messages % len(procs) else 0) for i in range(len(procs))]
        await asyncio.gather(
            *(_publisher(c, topic, n, pad, run) for c, n in zip(clients, shares, strict=True))
        )
        deadline = time.monotonic() + timeout_s
        while sum(map(len, held)) < len(run.published) and time.monotonic() < deadline:
            batches = await asyncio.gather(*(c.pull(max_messages=PULL_BATCH, wait=0.5) for c in clients))
            for receipts, batch in zip(held, batches, strict=True):
                receipts.update((m.id, m.receipt or "") for m in batch)
        in_flight = len({i for receipts in held for i in receipts})
        rss = [round(_rss_kib(sc.process.pid) / 1024, 1) for sc in procs]
        for client, receipts in zip(clients, held, strict=True):
            pending = list(receipts.values())
            for i in range(0, len(pending), PULL_BATCH):
                await client.ack_batch(pending[i : i + PULL_BATCH])
    finally:
        await asyncio.gather(*(c.close() for c in clients))
    return {
        "in_flight_held": in_flight,
        "rss_mib_at_in_flight": max(rss),
        "rss_mib_at_in_flight_by_sidecar": rss,
    }


async def _publisher(client: AsyncClient, topic: str, count: int, pad: str, run: Tracker) -> None:
    sent = 0
    while sent < count and not run.done.is_set():
        size = min(PUBLISH_BATCH, count - sent)
        started = run.publishing()
        try:
            result = await client.publish_batch(topic, [message(pad) for _ in range(size)])
        except SidecarError as exc:
            run.publish_errors += size
            await asyncio.sleep(exc.retry_after or 0.5)
            continue
        for entry in result.results:
            if entry.result is not None:
                run.on_published(entry.result.id, started)
            else:
                run.on_publish_error()
        sent += size


async def _worker(client: AsyncClient, run: Tracker) -> None:
    """Pull and ack batches until the tracker is done (every message acked, or time is up)."""
    while not run.done.is_set():
        try:
            msgs = await client.pull(max_messages=PULL_BATCH, wait=1.0)
        except SidecarError:
            await asyncio.sleep(0.2)
            continue
        if not msgs:
            continue
        now = time.time()  # wall clock: created_at is the publishing sidecar's epoch seconds
        for m in msgs:
            run.on_received(m.created_at, now)
        started = time.perf_counter()
        try:
            result = await client.ack_batch([m.receipt or "" for m in msgs])
        except SidecarError:
            run.ack_errors += len(msgs)
            continue
        for m, entry in zip(msgs, result.results, strict=True):
            if entry.status == 200:
                run.on_acked(m.id, started)
            else:
                run.on_ack_error()


async def _sample(procs: list[_Sidecar], peaks: _Peaks) -> None:
    """Peak RSS of every sidecar, and peak leases held, until cancelled."""
    while True:
        for sc in procs:
            sc.rss_peak_kib = max(sc.rss_peak_kib, _rss_kib(sc.process.pid))
        try:
            held = sum(await asyncio.gather(*(asyncio.to_thread(_leases_held, sc) for sc in procs)))
            peaks.leases = max(peaks.leases, held)
        except OSError:
            pass
        await asyncio.sleep(0.2)


def _percentile_ms(values: list[float], q: float) -> float | None:
    value = percentile(values, q)
    return None if value is None else round(value * 1000, 2)


# -- sidecar processes -----------------------------------------------------------------------------


def _start(workdir: Path, index: int, env: Mapping[str, str]) -> _Sidecar:
    (port,) = free_ports(1)
    here = str(Path(bucketq.__file__).resolve().parents[1])  # the children run this very bucketq
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    log_path = workdir / f"sidecar-{index}.log"
    proc = launch(
        [sys.executable, "-m", "bucketq.sidecar"],
        log_path,
        cwd=workdir,
        env={**env, "BUCKETQ_SIDECAR_LISTEN_PORT": str(port), "PYTHONPATH": path},
    )
    return _Sidecar(proc, f"http://127.0.0.1:{port}", log_path)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as resp:
        data: bytes = resp.read()
        return data


def _wait_ready(sc: _Sidecar) -> None:
    wait_http(
        sc.url + "/readyz", sc.process, sc.log_path, "sidecar", timeout=READY_TIMEOUT_S, any_status=False
    )


def _s3_requests(sc: _Sidecar) -> Counter[str]:
    """``bucketq_s3_requests_total`` of one sidecar, summed by operation."""
    out: Counter[str] = Counter()
    for family in text_string_to_metric_families(_get(sc.url + "/metrics").decode()):
        if family.name == "bucketq_s3_requests":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[sample.labels["op"]] += int(sample.value)
    return out


def _leases_held(sc: _Sidecar) -> int:
    status = json.loads(_get(sc.url + "/v1/status"))
    return int(status.get("leases_held", 0))


def _rss_kib(pid: int) -> int:
    """VmRSS of a process in KiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _stop(sc: _Sidecar) -> None:
    stop_process(sc.process, timeout=STOP_TIMEOUT_S)
