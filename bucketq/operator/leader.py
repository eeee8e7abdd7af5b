"""Leader election over a ``coordination.k8s.io/v1`` Lease: one active operator, standbys ready.

kopf's peering (1.45) is no leader election: peers of equal priority all pause, and a peer of
higher priority takes over without waiting for the running one to stop. So the operator elects its
leader itself, with the Lease protocol of Kubernetes' own controllers (client-go's leaderelection):

* a candidate takes the Lease when it is free (no holder: released) or when its record has not
  changed for ``lease_duration_s`` **as observed on the candidate's own monotonic clock** since it
  last saw it change. No clocks are compared between hosts: only durations, each on one host;
* the leader renews every ``retry_period_s``; every write carries the record's resourceVersion, so
  of two writers racing for the Lease one gets 409 and loses;
* the leader counts itself leader only until ``renew_deadline_s`` after the *start* of its last
  successful renewal: past it, it has lost, and it must have stopped all work before the Lease can
  expire for the others. A standby sees that renewal at the earliest when it starts, so it cannot
  take over before ``start + lease_duration_s``.

Invariant (no two operators work at once): work stops by ``fence_at()`` = last renewal start +
(``renew_deadline_s`` + ``lease_duration_s``) / 2, which comes before any standby can take the
Lease, provided the hosts' clocks run at about the same rate (not that they agree). The runner
enforces it: a leader whose work has not stopped by then exits the process at once.

The API is reached with the operator's own login (the pod's service account, or a kubeconfig),
through a small aiohttp client: the Lease is read and written before kopf runs.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import random
import socket
import ssl
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf

from bucketq import __version__

log = logging.getLogger("bucketq.operator.leader")

LoginFn = Callable[..., Any]


class LeadershipLost(Exception):
    """The leader could not renew its Lease in time: it stopped working and must exit."""


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    """Which Lease, who we are, and the timing (client-go's defaults: 15, 10, 2 s)."""

    name: str
    namespace: str
    identity: str
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration, got "
                f"{self.retry_period_s:g} < {self.renew_deadline_s:g} < {self.lease_duration_s:g}"
            )


def default_identity() -> str:
    """The pod's name (``POD_NAME``, from the downward API), else host, pid and a random suffix."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def in_cluster_namespace() -> str | None:
    """The namespace of the pod's service account (``POD_NAMESPACE``, else the mounted file)."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or None
    except OSError:
        return None


def micro_time(at: datetime.datetime | None = None) -> str:
    """A Kubernetes MicroTime (RFC 3339, microseconds, UTC)."""
    at = at or datetime.datetime.now(datetime.UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseApi:
    """GET, POST and PUT of one Lease, with the credentials a kopf login handler returns."""

    def __init__(self, login: LoginFn, namespace: str, name: str, timeout_s: float) -> None:
        self.login = login
        self.namespace = namespace
        self.name = name
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._server = ""
        self._files: list[str] = []

    @property
    def collection(self) -> str:
        return f"{self._server}/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"

    async def _connect(self) -> aiohttp.ClientSession:
        if self._session is not None:
            return self._session
        info = self.login(settings=kopf.OperatorSettings(), logger=log)
        if asyncio.iscoroutine(info):
            info = await info
        if not isinstance(info, kopf.ConnectionInfo):
            raise RuntimeError("no Kubernetes credentials for leader election (login returned nothing)")
        self._server = info.server.rstrip("/")
        headers = {"Accept": "application/json", "User-Agent": f"bucketq-operator/{__version__}"}
        if info.token:
            headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
        auth = aiohttp.BasicAuth(info.username, info.password or "") if info.username else None
        ssl_context: ssl.SSLContext | bool = False if info.insecure else self._ssl(info)
        self._session = aiohttp.ClientSession(
            headers=headers,
            auth=auth,
            connector=aiohttp.TCPConnector(ssl=ssl_context),
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
        )
        return self._session

    def _ssl(self, info: kopf.ConnectionInfo) -> ssl.SSLContext:
        ca_data = info.ca_data.decode() if isinstance(info.ca_data, bytes) else info.ca_data
        context = ssl.create_default_context(
            cafile=os.fsdecode(info.ca_path) if info.ca_path else None, cadata=ca_data
        )
        cert = self._file(info.certificate_path, info.certificate_data)
        key = self._file(info.private_key_path, info.private_key_data)
        if cert is not None:
            context.load_cert_chain(cert, key)
        return context

    def _file(self, path: Any, data: Any) -> str | None:
        if path:
            return os.fsdecode(path)
        if not data:
            return None
        with tempfile.NamedTemporaryFile("wb", delete=False, suffix=".pem") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
        self._files.append(f.name)
        return f.name

    async def _request(self, method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        session = await self._connect()
        async with session.request(method, url, json=body) as resp:
            if resp.status == 401:
                await self.close()  # a rotated token: log in again next time
            payload = await resp.json(content_type=None) if resp.status != 204 else None
            return resp.status, payload

    async def get(self) -> dict[str, Any] | None:
        status, body = await self._request("GET", f"{self.collection}/{self.name}")
        if status == 404:
            return None
        _check(status, body, "read")
        return dict(body)

    async def create(self, spec: dict[str, Any]) -> dict[str, Any] | None:
        """The created Lease, or None when another candidate created it first (409)."""
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
        }
        status, body = await self._request("POST", self.collection, lease)
        if status == 409:
            return None
        _check(status, body, "create")
        return dict(body)

    async def replace(self, lease: dict[str, Any]) -> dict[str, Any] | None:
        """The Lease written over the version read, or None when it changed since (409)."""
        status, body = await self._request("PUT", f"{self.collection}/{self.name}", lease)
        if status == 409:
            return None
        _check(status, body, "update")
        return dict(body)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        for path in self._files:
            try:
                os.unlink(path)
            except OSError:
                pass
        self._files.clear()


def _check(status: int, body: Any, what: str) -> None:
    if not 200 <= status < 300:
        message = body.get("message") if isinstance(body, dict) else body
        raise RuntimeError(f"cannot {what} the leader Lease: HTTP {status}: {message}")


class LeaderElector:
    """Campaigns for the Lease, then keeps it; :attr:`leading` and :attr:`lost` tell the runner.

    :meth:`run` returns when leadership is lost (after setting :attr:`lost`), or never (cancel it).
    """

    def __init__(
        self,
        api: LeaseApi,
        config: LeaseConfig,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.api = api
        self.config = config
        self.clock = clock
        self.on_change = on_change  # called when leading or lost changes
        self.leading = asyncio.Event()
        self.lost = asyncio.Event()
        self.renewed_at: float | None = None  # start of the last successful acquire or renewal
        self._observed_version: str | None = None
        self._observed_at = 0.0
        self._record: dict[str, Any] | None = None

    def fence_at(self) -> float:
        """By then (monotonic) the leader has stopped all work, or exits (see the module docstring)."""
        assert self.renewed_at is not None
        c = self.config
        return self.renewed_at + (c.renew_deadline_s + c.lease_duration_s) / 2

    async def run(self) -> None:
        c = self.config
        while not self.leading.is_set():
            if await self._attempt(c.retry_period_s):
                self.leading.set()
                self.on_change()
                log.info("%s leads (Lease %s/%s)", c.identity, c.namespace, c.name)
                break
            await asyncio.sleep(c.retry_period_s * random.uniform(1.0, 1.2))
        while True:
            await asyncio.sleep(c.retry_period_s)
            assert self.renewed_at is not None
            deadline = self.renewed_at + c.renew_deadline_s
            left = deadline - self.clock()
            if left > 0 and await self._attempt(left):
                continue
            if self.clock() >= deadline:
                log.error(
                    "%s could not renew the Lease within %gs: it stops leading",
                    c.identity,
                    c.renew_deadline_s,
                )
                self.leading.clear()
                self.lost.set()
                self.on_change()
                return

    async def _attempt(self, budget_s: float) -> bool:
        started = self.clock()
        try:
            async with asyncio.timeout(max(0.05, budget_s)):
                won = await self._try()
        except (TimeoutError, aiohttp.ClientError, RuntimeError, OSError, ValueError) as exc:
            log.warning("leader election: %s", str(exc) or type(exc).__name__)
            return False
        if won:
            self.renewed_at = started
        return won

    async def _try(self) -> bool:
        c = self.config
        now = micro_time()
        record = await self.api.get()
        if record is None:
            created = await self.api.create(
                {
                    "holderIdentity": c.identity,
                    "leaseDurationSeconds": max(1, round(c.lease_duration_s)),
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                }
            )
            self._observe(created)
            return created is not None
        self._observe(record)
        spec = dict(record.get("spec") or {})
        holder = spec.get("holderIdentity") or ""
        if holder != c.identity:
            duration = float(spec.get("leaseDurationSeconds") or c.lease_duration_s)
            if holder and self.clock() < self._observed_at + duration:
                return False  # held, and renewed less than a lease duration ago as far as we saw
            spec.update(
                holderIdentity=c.identity,
                leaseDurationSeconds=max(1, round(c.lease_duration_s)),
                acquireTime=now,
                renewTime=now,
                leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1,
            )
            if holder:
                log.warning(
                    "%s takes over the Lease from %s (not renewed for %gs)", c.identity, holder, duration
                )
        else:
            spec["renewTime"] = now
        written = await self.api.replace({**record, "spec": spec})
        self._observe(written)
        return written is not None

    def _observe(self, record: dict[str, Any] | None) -> None:
        if record is None:
            return
        version = str((record.get("metadata") or {}).get("resourceVersion"))
        if version != self._observed_version:
            self._observed_version = version
            self._observed_at = self.clock()
        self._record = record

    async def release(self) -> None:
        """Give the Lease up (after all work stopped): a standby takes it at its next try."""
        if not self.leading.is_set() or self.lost.is_set():
            return
        self.leading.clear()
        try:
            async with asyncio.timeout(self.config.retry_period_s * 2):
                record = await self.api.get()
                if record is None or (record.get("spec") or {}).get("holderIdentity") != self.config.identity:
                    return
                spec = {**record["spec"], "holderIdentity": "", "renewTime": micro_time()}
                await self.api.replace({**record, "spec": spec})
            log.info("%s released the Lease", self.config.identity)
        except (TimeoutError, aiohttp.ClientError, RuntimeError, OSError) as exc:
            log.warning("could not release the Lease (it expires on its own): %s", exc)


class ElectionThread:
    """A :class:`LeaderElector` on a thread and event loop of its own.

    The operator's loop can be busy or blocked for seconds (a synchronous step in a handler, a
    storage client built on first use, a loaded host): renewals must not wait for it, or a
    leader that is working loses its Lease for nothing. The runner reads :attr:`leading`,
    :attr:`lost` (threading events) and :meth:`fence_at`, and ends it with :meth:`stop`.
    """

    def __init__(self, api: LeaseApi, config: LeaseConfig) -> None:
        self.api = api
        self.config = config
        self.leading = threading.Event()
        self.lost = threading.Event()
        self.elector = LeaderElector(api, config, on_change=self._mirror)
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._release = False
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, name="leader-election", daemon=True)

    def start(self) -> ElectionThread:
        self._thread.start()
        self._started.wait(10)
        return self

    def fence_at(self) -> float:
        return self.elector.fence_at()

    def clock(self) -> float:
        return self.elector.clock()

    def _mirror(self) -> None:
        if self.elector.leading.is_set():
            self.leading.set()
        else:
            self.leading.clear()
        if self.elector.lost.is_set():
            self.lost.set()

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._run())
        finally:
            self._loop.close()

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        self._started.set()
        campaign = asyncio.create_task(self.elector.run())
        await self._stop.wait()
        campaign.cancel()
        await asyncio.gather(campaign, return_exceptions=True)
        if self._release:
            await self.elector.release()
            self._mirror()
        await self.api.close()

    async def stop(self, *, release: bool) -> None:
        """Stop campaigning and renewing; with ``release``, give the Lease up first (all work has
        stopped). Waits for the thread to end."""
        if not self._thread.is_alive():
            return

        def signal() -> None:
            self._release = release
            assert self._stop is not None
            self._stop.set()

        self._loop.call_soon_threadsafe(signal)
        await asyncio.to_thread(self._thread.join, self.config.renew_deadline_s + 5)
