"""Sidecar processes for tests: ``python -m bucketq.sidecar`` on free 127.0.0.1 ports, env-configured."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bucketq import Bucketq
from bucketq.client import AsyncClient, Client
from bucketq.config import Settings
from bucketq.sidecar.config import POD_ENV
from tests.support.servers import free_ports

T = TypeVar("T")
START_TIMEOUT_S = 30.0
REPO = Path(__file__).resolve().parents[2]

# Fast loops so that expiry, membership changes and redelivery happen within seconds.
FAST_ENGINE_ENV = {
    "BUCKETQ_CONSUMER__CLOCK_SKEW_S": "0.3",
    "BUCKETQ_CONSUMER__HEARTBEAT_INTERVAL_S": "0.5",
    "BUCKETQ_CONSUMER__MEMBER_TTL_S": "3",
    "BUCKETQ_CONSUMER__FOREIGN_POLL_MS": "200",
    "BUCKETQ_PRODUCER__LINGER_MS": "5",
}


def engine_env(settings: Settings) -> dict[str, str]:
    """``BUCKETQ_*`` variables equivalent to ``settings`` (the S3 part)."""
    env = {
        "BUCKETQ_BACKEND": settings.backend,
        "BUCKETQ_STRATEGY": settings.strategy,
        "BUCKETQ_S3_BUCKET": settings.s3_bucket or "",
        "BUCKETQ_S3_REGION": settings.s3_region,
        "BUCKETQ_S3_CONNECT_TIMEOUT_S": str(settings.s3_connect_timeout_s),
        "BUCKETQ_S3_READ_TIMEOUT_S": str(settings.s3_read_timeout_s),
    }
    if settings.s3_endpoint_url:
        env["BUCKETQ_S3_ENDPOINT_URL"] = settings.s3_endpoint_url
    if settings.s3_access_key_id:
        env["BUCKETQ_S3_ACCESS_KEY_ID"] = settings.s3_access_key_id.get_secret_value()
    if settings.s3_secret_access_key:
        env["BUCKETQ_S3_SECRET_ACCESS_KEY"] = settings.s3_secret_access_key.get_secret_value()
    return env


SidecarFactory = Callable[..., "SidecarProc"]


@dataclass
class SidecarProc:
    """A running sidecar process."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    metrics_port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    # The sidecar's tests look at each answer as it comes: their clients do not retry 429/503 by
    # themselves unless a test asks for it (retry=RetryPolicy(...)); tests/client tests the retries.
    def client(self, **kw: Any) -> Client:
        return Client(self.url, **{"retry": None, **kw})

    def aclient(self, **kw: Any) -> AsyncClient:
        return AsyncClient(self.url, **{"retry": None, **kw})

    def log(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/v1/status", timeout=5) as resp:
            result: dict[str, Any] = json.loads(resp.read())
            return result

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"sidecar {self.name} did not exit within {timeout:g}s; log:\n{self.log()}"
            ) from None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def start_sidecar(
    workdir: Path,
    settings: Settings,
    name: str = "sidecar",
    *,
    wait_ready: bool = True,
    extra_env: Mapping[str, str] | None = None,
    **sidecar: Any,
) -> SidecarProc:
    """Start ``python -m bucketq.sidecar`` with ``BUCKETQ_SIDECAR_<KEY>=value`` for each keyword (and
    ``extra_env`` as given). It runs as outside a pod unless ``extra_env`` says otherwise."""
    port, metrics_port = free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BUCKETQ_"))}
    env.pop(POD_ENV, None)
    env.update(extra_env or {})
    env.update(AWS_EC2_METADATA_DISABLED="true", PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    env.update(engine_env(settings))
    env.update(FAST_ENGINE_ENV)
    env.update({"BUCKETQ_SIDECAR_LISTEN_PORT": str(port), "BUCKETQ_SIDECAR_METRICS_PORT": str(metrics_port)})
    for key, value in sidecar.items():
        if key.startswith("BUCKETQ_"):
            env[key] = str(value)
        else:
            env[f"BUCKETQ_SIDECAR_{key.upper()}"] = ",".join(value) if isinstance(value, list) else str(value)
    log_path = workdir / f"{name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bucketq.sidecar"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
        )
    sc = SidecarProc(name, proc, port, metrics_port, log_path, env)
    if wait_ready:
        wait_ready_or_fail(sc)
    return sc


def wait_ready_or_fail(sc: SidecarProc, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if sc.process.poll() is not None:
            raise AssertionError(f"sidecar {sc.name} exited with {sc.process.returncode}; log:\n{sc.log()}")
        try:
            with urllib.request.urlopen(sc.url + "/readyz", timeout=2):
                return
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read()[:300]!r}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.05)
    raise AssertionError(f"sidecar {sc.name} not ready within {timeout:g}s ({last}); log:\n{sc.log()}")


def eventually(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll ``check`` until it returns a truthy value; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


async def aeventually(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Async :func:`eventually`: ``check`` may be a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(interval)


async def create_topics(settings: Settings, *topics: str, **config: Any) -> None:
    """Create ``topics`` (idempotent) with the engine, as the operator would."""
    async with Bucketq(settings) as bq:
        for topic in topics:
            await bq.create_topic(topic, **config)
