"""``bucketq bench --via sidecar``: apps talking HTTP to sidecar processes, end to end.

:func:`run_via_sidecar` starts N sidecar processes against an S3 endpoint, publishes through them
over HTTP (batches) while HTTP pull workers consume and ack, and reports throughput, S3 requests per
message (from each sidecar's ``bucketq_s3_requests_total``), latency, duplicates, losses and the
sidecars' peak RSS (``VmRSS`` from ``/proc``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

import bucketq
from bucketq.client import AsyncClient, SidecarError, message
from bucketq.config import Settings
from bucketq.core.app import Bucketq

PUBLISH_BATCH = 250
PULL_BATCH = 500
WORKERS_PER_SIDECAR = 2
PUBLISHERS_PER_SIDECAR = 2
DEFAULT_CREDENTIALS = ("bucketq-test", "bucketq-test-secret")


@dataclass
class _Sidecar:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    rss_peak_kib: int = 0


@dataclass
class _Run:
    """What the workers saw."""

    published: set[str] = field(default_factory=set)
    acks: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    publish_errors: int = 0
    ack_errors: int = 0
    first_publish: float | None = None
    last_ack: float | None = None
    leases_peak: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)


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
    key = access_key or os.environ.get("BUCKETQ_S3_ACCESS_KEY_ID") or DEFAULT_CREDENTIALS[0]
    secret = secret_key or os.environ.get("BUCKETQ_S3_SECRET_ACCESS_KEY") or DEFAULT_CREDENTIALS[1]
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
        run = _Run()
        sampler = asyncio.get_running_loop().create_task(_sample(procs, run))
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
    acked = len(run.acks)
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
        "p50_ms": _percentile_ms(run.latencies, 50),
        "p99_ms": _percentile_ms(run.latencies, 99),
        "duplicates": sum(n - 1 for n in run.acks.values()),
        "lost": len(run.published - set(run.acks)),
        "published": len(run.published),
        "acked": acked,
        "publish_errors": run.publish_errors,
        "ack_errors": run.ack_errors,
        "leases_held_peak": run.leases_peak,
        "rss_peak_mib": max(rss) if rss else 0.0,
        "rss_peak_mib_by_sidecar": rss,
        **(held or {}),
    }


# -- the workload ----------------------------------------------------------------------------------


async def _drive(
    procs: list[_Sidecar], topic: str, messages: int, payload_bytes: int, run: _Run, timeout_s: float
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
            asyncio.create_task(_worker(client, run, messages))
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
    return len(run.acks) >= messages


async def _hold(
    procs: list[_Sidecar], topic: str, messages: int, payload_bytes: int, timeout_s: float
) -> dict[str, Any]:
    """Publish ``messages`` and keep them all in flight (pulled, unacked); RSS then; then ack all."""
    run = _Run()
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


async def _publisher(client: AsyncClient, topic: str, count: int, pad: str, run: _Run) -> None:
    sent = 0
    while sent < count and not run.done.is_set():
        size = min(PUBLISH_BATCH, count - sent)
        if run.first_publish is None:
            run.first_publish = time.perf_counter()
        try:
            result = await client.publish_batch(topic, [message(pad) for _ in range(size)])
        except SidecarError as exc:
            run.publish_errors += size
            await asyncio.sleep(exc.retry_after or 0.5)
            continue
        for entry in result.results:
            if entry.result is not None:
                run.published.add(entry.result.id)
            else:
                run.publish_errors += 1
        sent += size


async def _worker(client: AsyncClient, run: _Run, expected: int) -> None:
    while not run.done.is_set():
        try:
            msgs = await client.pull(max_messages=PULL_BATCH, wait=1.0)
        except SidecarError:
            await asyncio.sleep(0.2)
            continue
        if not msgs:
            continue
        now = time.time()
        run.latencies.extend(max(0.0, now - m.created_at) for m in msgs)
        try:
            result = await client.ack_batch([m.receipt or "" for m in msgs])
        except SidecarError:
            run.ack_errors += len(msgs)
            continue
        for m, entry in zip(msgs, result.results, strict=True):
            if entry.status == 200:
                run.acks[m.id] += 1
            else:
                run.ack_errors += 1
        run.last_ack = time.perf_counter()
        if len(run.acks) >= expected:
            run.done.set()


async def _sample(procs: list[_Sidecar], run: _Run) -> None:
    """Peak RSS of every sidecar, and peak leases held, until cancelled."""
    while True:
        for sc in procs:
            sc.rss_peak_kib = max(sc.rss_peak_kib, _rss_kib(sc.process.pid))
        try:
            held = sum(await asyncio.gather(*(asyncio.to_thread(_leases_held, sc) for sc in procs)))
            run.leases_peak = max(run.leases_peak, held)
        except OSError:
            pass
        await asyncio.sleep(0.2)


def _percentile_ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered), max(1, math.ceil(q / 100 * len(ordered)))) - 1] * 1000, 2)


# -- sidecar processes -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(workdir: Path, index: int, env: Mapping[str, str]) -> _Sidecar:
    port = _free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BUCKETQ_"))}
    full.update(env)
    full.update(BUCKETQ_SIDECAR_LISTEN_PORT=str(port), AWS_EC2_METADATA_DISABLED="true")
    here = str(Path(bucketq.__file__).resolve().parents[1])  # the children run this very bucketq
    full["PYTHONPATH"] = os.pathsep.join(p for p in (here, full.get("PYTHONPATH")) if p)
    log_path = workdir / f"sidecar-{index}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bucketq.sidecar"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full,
            cwd=workdir,
        )
    return _Sidecar(proc, f"http://127.0.0.1:{port}", log_path)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as resp:
        data: bytes = resp.read()
        return data


def _wait_ready(sc: _Sidecar, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sc.process.poll() is not None:
            raise RuntimeError(
                f"sidecar exited with {sc.process.returncode}: {sc.log_path.read_text()[-2000:]}"
            )
        with contextlib.suppress(OSError, urllib.error.HTTPError):
            _get(sc.url + "/readyz")
            return
        time.sleep(0.05)
    raise RuntimeError(
        f"sidecar at {sc.url} not ready within {timeout:g}s: {sc.log_path.read_text()[-2000:]}"
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
    import json

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
    if sc.process.poll() is None:
        sc.process.send_signal(signal.SIGTERM)
        try:
            sc.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            sc.process.kill()
            sc.process.wait(timeout=10)
