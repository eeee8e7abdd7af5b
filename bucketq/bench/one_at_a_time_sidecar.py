"""``one-at-a-time --via sidecar``: the same conversation between two apps, each beside its sidecar.

The consuming app is this process: it long-polls its sidecar's ``/v1/pull`` (20 s at a time) and
acks what it gets, or (push) answers the POSTs its sidecar makes to it with 200. The publishing app
is the publisher process (:mod:`bucketq.bench.publisher_process`), speaking HTTP to a publish-only
sidecar of its own. Both sidecars are processes on the run's bucket; the requests are counted at
the S3 server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from bucketq.bench.backends import Backend
from bucketq.bench.fleet import GROUP, open_fleet
from bucketq.bench.idle_sidecar import LONG_POLL_S, sidecar_env
from bucketq.bench.metering import Meter
from bucketq.bench.one_at_a_time import (
    SETTLE_TIMEOUT_S,
    ArrivalFn,
    Arrivals,
    PublisherProcess,
    _measure,
    _result,
    _window,
    free_port,
)
from bucketq.bench.params import BenchParams
from bucketq.bench.report import RunResult
from bucketq.bench.sidecar import _leases_held, _Sidecar, _start, _stop, _wait_ready
from bucketq.bench.tracker import Tracker
from bucketq.client import AsyncClient, SidecarError

PUSH_PATH = "/bucketq"


@dataclass
class PullApp:
    """The app long-polls its sidecar, hands each message to the arrival function, acks."""

    client: AsyncClient
    arrived: ArrivalFn
    acking: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    loop: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.loop = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while not self.stop.is_set():
            try:
                msgs = await self.client.pull(max_messages=10, wait=LONG_POLL_S)
            except SidecarError:
                await asyncio.sleep(0.5)
                continue
            if not msgs:
                continue
            self.acking += 1
            try:
                for m in msgs:
                    self.arrived(m.payload, m.id)
                await self.client.ack_batch([m.receipt or "" for m in msgs])
            finally:
                self.acking -= 1

    async def settled(self) -> None:
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while self.acking and time.monotonic() < deadline:
            await asyncio.sleep(0.002)

    async def close(self) -> None:
        self.stop.set()
        if self.loop is not None:
            self.loop.cancel()  # a long poll in flight would hold the close for its whole wait
            await asyncio.gather(self.loop, return_exceptions=True)


@dataclass
class PushApp:
    """The app's HTTP endpoint its sidecar pushes to; a 200 is the ack."""

    arrived: ArrivalFn
    port: int
    sidecar: _Sidecar | None = None
    runner: web.AppRunner | None = None

    async def start(self) -> None:
        async def handle(request: web.Request) -> web.Response:
            body: dict[str, Any] = await request.json()
            self.arrived(body["payload"], body["id"])
            return web.Response(status=200)

        app = web.Application()
        app.router.add_post(PUSH_PATH, handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def settled(self) -> None:
        """Until the sidecar holds no lease: the ack of the last push is committed."""
        if self.sidecar is None:
            return
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if await asyncio.to_thread(_leases_held, self.sidecar) == 0:
                    return
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def run_sidecar(backend: Backend, p: BenchParams, workdir: Path, *, push: bool) -> RunResult:
    """bucketq through two sidecars (the consumer's: pull or push; the publisher's: publish only)."""
    fleet = await open_fleet(backend, "bench-one", p.partitions)
    tracker = Tracker(expected=p.one_messages)
    arrivals = Arrivals(tracker)
    settings = fleet.run.settings
    env = sidecar_env(settings, GROUP, fleet.topic)
    publishing_env = {
        k: v for k, v in env.items() if k not in ("BUCKETQ_SIDECAR_CONSUMER", "BUCKETQ_SIDECAR_TOPICS")
    }
    sidecars: list[_Sidecar] = []
    side: PullApp | PushApp | None = None
    client: AsyncClient | None = None
    publisher: PublisherProcess | None = None
    try:
        meter = Meter(backend, fleet.run)
        if push:
            side = PushApp(arrivals, free_port())
            await side.start()
            env = {
                **env,
                "BUCKETQ_SIDECAR_DELIVERY": "push",
                "BUCKETQ_SIDECAR_APP_PORT": str(side.port),
                "BUCKETQ_SIDECAR_APP_PATH": PUSH_PATH,
            }
        tag = "push" if push else "pull"
        consuming = _start(workdir, len(sidecars), env)
        sidecars.append(consuming)
        publishing = _start(workdir, len(sidecars), publishing_env)
        sidecars.append(publishing)
        await asyncio.gather(*(asyncio.to_thread(_wait_ready, sc) for sc in sidecars))
        if isinstance(side, PushApp):
            side.sidecar = consuming
        else:
            client = AsyncClient(consuming.url, timeout=LONG_POLL_S + 30)
            side = PullApp(client, arrivals)
            side.start()
        config = {
            "kind": "sidecar",
            "url": publishing.url,
            "topic": fleet.topic,
            "payload_bytes": p.payload_bytes,
        }
        publisher = await PublisherProcess.start(config, workdir)
        helpers = [sc.process.pid for sc in sidecars]
        measured = await _measure(backend, p, _window(meter), side, arrivals, publisher, helpers)
        return _result(
            backend,
            p,
            measured,
            system="bucketq",
            variant=f"sidecar ({tag}); the publisher through a sidecar of its own",
            strategy=fleet.strategy,
            profile=settings.profile,
            via="sidecar",
        )
    finally:
        if side is not None:
            await side.close()
        if client is not None:
            await client.close()
        if publisher is not None:
            await publisher.stop()
        await asyncio.gather(*(asyncio.to_thread(_stop, sc) for sc in sidecars))
        await fleet.run.close()
