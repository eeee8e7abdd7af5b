"""The engine inside the sidecar: connect (with retries), readiness, and access to producer and consumer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Literal

from bucketq.core.app import Bucketq
from bucketq.core.consumer import Consumer
from bucketq.core.hooks import CommitCounts
from bucketq.core.producer import Producer
from bucketq.errors import BucketqError, ConfigError, InvalidName, StorageError, TopicNotFound
from bucketq.sidecar.config import SidecarConfig
from bucketq.sidecar.errors import ApiError, unavailable
from bucketq.sidecar.instrumented import InstrumentedStore
from bucketq.sidecar.metrics import Metrics
from bucketq.sidecar.tracecontext import Tracing
from bucketq.storage.strategies import build_store

log = logging.getLogger("bucketq.sidecar")

State = Literal["starting", "ready", "draining", "stopped"]


class Runtime:
    """Owns the :class:`Bucketq` connection, the producer and (optionally) the consumer."""

    def __init__(self, config: SidecarConfig, metrics: Metrics) -> None:
        self.config = config
        self.cfg = config.sidecar
        self.metrics = metrics
        self.state: State = "starting"
        self.reason = "connecting to the bucket"
        self.bq: Bucketq | None = None  # set once ready
        self.store: InstrumentedStore | None = None
        # opened (bucket probed, strategy chosen, format checked) but not ready yet: while a topic is
        # missing only the registrations are retried, so the probe's PUT and DELETE run once
        self._opened: Bucketq | None = None
        self._opened_producer: Producer | None = None
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self.strategy: str | None = None
        self.connected = asyncio.Event()
        self.started_at = time.time()
        self.tracing = Tracing()  # spans when opentelemetry is installed (the otel extra)
        metrics.buffer_capacity.set(self.cfg.publish_buffer_size)

    # -- state -----------------------------------------------------------------------------------

    @property
    def consumer_name(self) -> str:
        return self.cfg.consumer or ""

    @property
    def draining(self) -> bool:
        return self.state in ("draining", "stopped")

    def readiness(self, *, detailed: bool = False) -> tuple[bool, dict[str, Any]]:
        """Ready when connected, the strategy is chosen, the bucket answers and we are not draining.

        Without ``detailed`` (the unauthenticated /readyz) the reason is one of a few fixed phrases:
        the detailed reason can name the bucket, its endpoint and S3 error texts.
        """
        problem = self.store.problem if self.store is not None else None
        healthy = self.store is not None and problem is None
        deleted = self._consumer.deleted_topics if self._consumer is not None else []
        reason: str | None = None
        generic: str | None = None
        if problem is not None:
            reason, generic = f"the bucket is not answering: {problem}", "bucket not answering"
        elif self.state != "ready":
            reason = self.reason
            generic = "connecting" if self.state == "starting" else "shutting down"
        elif deleted:
            reason, generic = f"subscribed topic {deleted[0]!r} was deleted", "a subscribed topic was deleted"
        ready = self.state == "ready" and healthy and not deleted
        self.metrics.ready.set(1 if ready else 0)
        if not detailed:
            info: dict[str, Any] = {"ready": ready, "state": self.state}
            if generic is not None:
                info["reason"] = generic
            return ready, info
        info = {"state": self.state, "strategy": self.strategy}
        if reason is not None:
            info["reason"] = reason
        info["ready"] = ready
        return ready, info

    def producer(self) -> Producer:
        """The producer, or a 503 while starting or draining."""
        if self.draining:
            raise unavailable("draining", "the sidecar is shutting down and accepts no new publishes")
        if self._producer is None:
            raise unavailable("not_ready", f"the sidecar is not ready yet: {self.reason}")
        return self._producer

    def consumer(self) -> Consumer:
        """The consumer, or 400 when none is configured, 503 while starting."""
        if not self.cfg.consumer:
            raise ApiError(400, "no_consumer", "this sidecar has no consumer (set BUCKETQ_SIDECAR_CONSUMER)")
        if self._consumer is None:
            raise unavailable("not_ready", f"the sidecar is not ready yet: {self.reason}")
        return self._consumer

    @property
    def current_consumer(self) -> Consumer | None:
        return self._consumer

    # -- connect ---------------------------------------------------------------------------------

    async def connect(self) -> None:
        """Open the bucket, register producer and consumer; retry S3 and missing-topic errors forever.

        Raises :class:`ConfigError` for problems no retry can fix (bad names or settings).
        """
        delay = 0.2
        while self.state == "starting":
            try:
                await self._connect_once()
                return
            except (ConfigError, InvalidName):
                await self._close_opened()
                raise
            except (StorageError, TopicNotFound, OSError) as exc:
                self.reason = str(exc)
            except BucketqError as exc:
                self.reason = str(exc)
            log.warning("not ready: %s (retrying in %.1fs)", self.reason, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.cfg.connect_retry_max_s)

    async def _connect_once(self) -> None:
        settings = self.config.engine
        bq = self._opened or await self._open()
        if self._opened_producer is None:
            self._opened_producer = await bq.register_producer(
                self.cfg.producer_name, publish_timeout_s=self.cfg.publish_timeout_s
            )
        consumer = await self._register_consumer(bq) if self.cfg.consumer else None
        if self.state != "starting":  # a shutdown began while we were connecting
            await self._close_opened()
            return
        self.bq, self._producer, self._consumer = bq, self._opened_producer, consumer
        self._opened, self._opened_producer = None, None
        self.strategy = bq.strategy
        self.state = "ready"
        self.reason = "ready"
        self.connected.set()
        log.info("connected to bucket %s (strategy %s)", settings.s3_bucket or settings.backend, bq.strategy)

    async def _open(self) -> Bucketq:
        """A new store and engine, opened; closed again when opening fails (the next try starts over)."""
        store = InstrumentedStore(
            build_store(self.config.engine), self.metrics.observe_s3, stall_s=self.cfg.s3_stall_s
        )
        bq = Bucketq(self.config.engine, store=store)
        self.store = store
        try:
            await bq.open()
        except BaseException:
            with contextlib.suppress(Exception):
                await bq.close()
            with contextlib.suppress(Exception):
                await store.close()
            raise
        self._opened = bq
        return bq

    async def _close_opened(self) -> None:
        bq, self._opened, self._opened_producer = self._opened, None, None
        if bq is not None:
            with contextlib.suppress(Exception):
                await bq.close()

    async def _register_consumer(self, bq: Bucketq) -> Consumer:
        assert self.cfg.consumer is not None
        overrides: dict[str, Any] = {}
        if self.cfg.visibility_timeout_s is not None:
            overrides["visibility_timeout_s"] = self.cfg.visibility_timeout_s
        if self.cfg.max_in_flight is not None:
            overrides["max_in_flight"] = self.cfg.max_in_flight
        consumer = await bq.register_consumer(
            self.cfg.consumer, self.cfg.topics, start_position=self.cfg.start_position, **overrides
        )
        name = self.cfg.consumer

        def on_commit(topic: str, partition: int, result: CommitCounts, seconds: float) -> None:
            self.metrics.observe_commit(name, topic, result, seconds)

        consumer.on_commit = on_commit
        self.metrics.prepare(name, self.cfg.topics, push=self.cfg.delivery == "push")
        return consumer

    # -- shutdown --------------------------------------------------------------------------------

    def begin_drain(self) -> None:
        """Refuse new publishes and pulls from now on; ask the consumer to stop claiming."""
        if self.state == "starting":
            self.reason = "shutting down"
        self.state = "draining"
        self.metrics.draining.set(1)
        self.metrics.ready.set(0)
        if self._consumer is not None:
            self._consumer.pause()

    async def close(self, timeout: float) -> bool:
        """Close consumer (releasing prefetched messages uncounted) and producers (flushing).

        Bounded by ``timeout``; True when the engine closed cleanly within it.
        """
        bq = self.bq
        self.state = "stopped"
        if bq is None:
            await self._close_opened()  # stopped while waiting for a topic: nothing to flush
            return True
        try:
            await asyncio.wait_for(bq.close(), max(0.0, timeout))
        except TimeoutError:
            log.error("closing the engine took longer than %.1fs; exiting anyway", timeout)
            return False
        except Exception as exc:
            log.error("closing the engine failed: %s", exc)
            return False
        return True
