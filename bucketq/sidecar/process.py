"""The sidecar process: start the servers and the engine, and drain gracefully on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time

from aiohttp import web

from bucketq.errors import ConfigError, InvalidName
from bucketq.sidecar.config import SidecarConfig
from bucketq.sidecar.delivery import Deliveries
from bucketq.sidecar.metrics import Metrics
from bucketq.sidecar.publishing import Publisher
from bucketq.sidecar.push import Pusher
from bucketq.sidecar.runtime import Runtime
from bucketq.sidecar.server import Api, build_api_app, build_metrics_app

log = logging.getLogger("bucketq.sidecar")

EXIT_OK = 0
EXIT_CONFIG = 2
SHUTDOWN_TIMEOUT_S = 2.0


class Sidecar:
    """One sidecar: HTTP servers, the engine runtime, push dispatcher and the lease reaper."""

    def __init__(self, config: SidecarConfig) -> None:
        self.config = config
        self.cfg = config.sidecar
        self.metrics = Metrics()
        self.runtime = Runtime(config, self.metrics)
        self.publisher = Publisher(self.runtime, self.metrics)
        self.deliveries = Deliveries(self.runtime, self.metrics)
        self.pusher = (
            Pusher(self.runtime, self.deliveries, self.metrics) if self.cfg.delivery == "push" else None
        )
        self.api = Api(self.runtime, self.publisher, self.deliveries, self.metrics)
        if self.pusher is not None:
            pusher = self.pusher
            self.api.push_in_flight = lambda: pusher.in_flight
        self._runners: list[web.AppRunner] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._dispatcher: asyncio.Task[None] | None = None
        self.stop_requested = asyncio.Event()
        self.api_port: int | None = None

    async def start(self) -> None:
        """Listen (API on localhost, probes/metrics on the metrics port) and connect in the background."""
        token = self.cfg.token()
        self.api_port = await self._listen(
            build_api_app(self.api, token=token), self.cfg.listen_host, self.cfg.listen_port
        )
        log.info("API listening on http://%s:%d", self.cfg.listen_host, self.api_port)
        if self.cfg.metrics_port:
            port = await self._listen(
                build_metrics_app(self.api), self.cfg.metrics_host, self.cfg.metrics_port
            )
            log.info("metrics and probes on http://%s:%d/metrics", self.cfg.metrics_host, port)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self.deliveries.reap_forever()))
        if self.pusher is not None:
            self._dispatcher = loop.create_task(self.pusher.run())

    async def _listen(self, app: web.Application, host: str, port: int) -> int:
        # aiohttp's keep-alive timer runs from the connection's start and from each response, and
        # trickled bytes do not reset it: so it bounds both an idle connection and one sending its
        # request head slowly (its default is an hour). Bodies are bounded in read_model.
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
            keepalive_timeout=self.cfg.idle_timeout_s,
        )
        await runner.setup()
        self._runners.append(runner)
        await web.TCPSite(runner, host, port, reuse_address=True).start()
        bound = runner.addresses[-1] if runner.addresses else None
        return int(bound[1]) if isinstance(bound, tuple) else port

    async def drain(self, grace: float) -> None:
        """SIGTERM: stop claiming and publishing, flush, let in-flight work finish, release the rest."""
        deadline = time.monotonic() + grace
        log.info("draining (grace %.1fs)", grace)
        self.runtime.begin_drain()
        if self.pusher is not None:
            await self.pusher.stop(self._dispatcher, deadline - time.monotonic())
        if not await self.publisher.wait_idle(deadline - time.monotonic()):
            log.warning("%d publishes still pending at the end of the grace period", self.publisher.pending)
        if not await self.deliveries.wait_settled(deadline - time.monotonic()):
            released = await self.deliveries.release_unsettled()
            log.warning("requeued %d messages the app had not settled", released)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.runtime.close(max(5.0, deadline - time.monotonic()))

    async def stop_servers(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()


async def run(config: SidecarConfig) -> int:
    """Run until SIGTERM/SIGINT, then drain; returns the process exit code."""
    sidecar = Sidecar(config)
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        log.info("received %s", sig.name)
        sidecar.stop_requested.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await sidecar.start()
    except OSError as exc:
        log.error("cannot listen: %s", exc)
        await sidecar.stop_servers()
        return EXIT_CONFIG
    connect = loop.create_task(sidecar.runtime.connect())
    stop = loop.create_task(sidecar.stop_requested.wait())
    await asyncio.wait({connect, stop}, return_when=asyncio.FIRST_COMPLETED)
    code = EXIT_OK
    if connect.done() and not connect.cancelled() and connect.exception() is not None:
        failure = connect.exception()
        log.error("cannot start: %s", failure)
        code = EXIT_CONFIG if isinstance(failure, ConfigError | InvalidName) else 1
    else:
        await stop
    connect.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await connect
    await sidecar.drain(0.0 if code else config.sidecar.drain_grace_s)
    await sidecar.stop_servers()
    log.info("stopped")
    return code
