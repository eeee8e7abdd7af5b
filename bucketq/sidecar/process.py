"""The sidecar process: start the servers and the engine; on SIGTERM drain and exit within the budget."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from aiohttp import web

from bucketq.errors import ConfigError, InvalidName
from bucketq.sidecar.config import SidecarConfig
from bucketq.sidecar.delivery import Deliveries
from bucketq.sidecar.metrics import Metrics
from bucketq.sidecar.publishing import Publisher
from bucketq.sidecar.push import Pusher
from bucketq.sidecar.runtime import Runtime
from bucketq.sidecar.server import Api, build_api_app, build_metrics_app
from bucketq.sidecar.shutdown import HARD_EXIT_AFTER_S, ShutdownPlan, Watchdog

log = logging.getLogger("bucketq.sidecar")

# exit codes (docs/sidecar-api.md)
EXIT_OK = 0  # stopped cleanly: drained, everything held given back, publishes flushed
EXIT_FAILED = 1  # could not start (not a configuration problem)
EXIT_CONFIG = 2  # bad configuration, or a port could not be bound
# the budget ran out, or the engine could not close (e.g. S3 unreachable): held leases expire on their own
EXIT_INCOMPLETE = 3

SHUTDOWN_TIMEOUT_S = 2.0  # aiohttp's wait for open requests when a server stops
SERVERS_STOP_MIN_S = 0.5  # stopping the servers may overrun a spent budget by this much


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
        # auto_decompress=False: aiohttp would inflate a gzip/deflate body as it arrives, before
        # any limit sees it (a 1 MiB body of zeros is 1 GiB inflated). Bodies stay as sent, and
        # read_model refuses a non-identity Content-Encoding with 415 (docs/sidecar-api.md).
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
            keepalive_timeout=self.cfg.idle_timeout_s,
            auto_decompress=False,
        )
        await runner.setup()
        self._runners.append(runner)
        await web.TCPSite(runner, host, port, reuse_address=True).start()
        bound = runner.addresses[-1] if runner.addresses else None
        return int(bound[1]) if isinstance(bound, tuple) else port

    async def shutdown(self, plan: ShutdownPlan) -> bool:
        """SIGTERM: drain, give back what is held, close; all within ``plan``'s budget.

        Returns True when everything finished (what the app held was requeued, prefetched leases
        released, publishes flushed, the engine closed), False when the budget ran out first or
        the engine could not close cleanly: the leases still held then expire on their own.
        """
        log.info(
            "shutting down: drain for up to %.1fs%s, exit within %.1fs",
            plan.drain_s,
            f" (DRAIN_GRACE_S {plan.drain_grace_s:g}s clipped to the budget)" if plan.clipped else "",
            plan.budget_s,
        )
        self.runtime.begin_drain()
        try:
            complete = await asyncio.wait_for(self._drain_and_close(plan), plan.left())
        except TimeoutError:
            complete = False
            consumer = self.runtime.current_consumer
            log.error(
                "shutdown budget of %.1fs spent before the engine closed; %d leases are left to "
                "expire on their own (their messages are redelivered after the visibility timeout)",
                plan.budget_s,
                consumer.in_flight if consumer is not None else 0,
            )
        # the servers answered the app's settlements until now; a stuck connection must not hold
        # the exit past the deadline by more than a moment
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop_servers(), max(plan.left(), SERVERS_STOP_MIN_S))
        return complete

    async def _drain_and_close(self, plan: ShutdownPlan) -> bool:
        if self.pusher is not None:
            # open requests may finish during the drain; the rest are cut and requeued
            await self.pusher.stop(self._dispatcher, plan.drain_left())
        if not await self.publisher.wait_idle(plan.drain_left()):
            log.warning("%d publishes still pending at the end of the drain", self.publisher.pending)
        if not await self.deliveries.wait_settled(plan.drain_left()):
            released = await self.deliveries.release_unsettled()
            log.warning("requeued %d messages the app had not settled", released)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        return await self.runtime.close(plan.left())

    async def stop_servers(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()


async def run(config: SidecarConfig) -> int:
    """Run until SIGTERM/SIGINT, then shut down within the budget; returns the process exit code."""
    cfg = config.sidecar
    sidecar = Sidecar(config)
    loop = asyncio.get_running_loop()
    for warning in cfg.deprecations:
        log.warning("%s", warning)
    plan: ShutdownPlan | None = None

    def on_signal(sig: signal.Signals) -> None:
        nonlocal plan
        log.info("received %s", sig.name)
        if plan is None:  # the first signal starts the one budget; a repeat does not extend it
            plan = ShutdownPlan(cfg.shutdown_budget_s, cfg.drain_grace_s)
            Watchdog(plan.deadline + HARD_EXIT_AFTER_S, EXIT_INCOMPLETE).arm()
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
        code = EXIT_CONFIG if isinstance(failure, ConfigError | InvalidName) else EXIT_FAILED
    else:
        await stop
    connect.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await connect
    if plan is None:  # no signal: the start failed, nothing was delivered, no drain
        plan = ShutdownPlan(cfg.shutdown_budget_s, 0.0)
        Watchdog(plan.deadline + HARD_EXIT_AFTER_S, code or EXIT_INCOMPLETE).arm()
    complete = await sidecar.shutdown(plan)
    if code == EXIT_OK and not complete:
        code = EXIT_INCOMPLETE
    log.info("stopped (exit code %d)", code)
    return code
