"""Publishing for the app: validate a whole request first, then publish with a bounded buffer."""

from __future__ import annotations

import asyncio
import contextlib

from bucketq.api_models import OutgoingMessage, PublishEntryResult, PublishResponse
from bucketq.core.producer import PreparedRecord, PublishResult
from bucketq.errors import BucketqError, InvalidArgument, MessageTooLarge
from bucketq.sidecar.errors import RETRY_AFTER_S, ApiError, from_exception, unavailable
from bucketq.sidecar.metrics import Metrics
from bucketq.sidecar.runtime import Runtime


class Publisher:
    """Publishes through the runtime's producer.

    At most ``publish_buffer_size`` messages and ``publish_buffer_bytes`` bytes (their encoded
    records) are pending. A publish whose request timed out stays pending, and so counted, until
    the engine gives up on it (within its own publish timeout): the record is in memory until then.
    """

    def __init__(self, runtime: Runtime, metrics: Metrics) -> None:
        self.runtime = runtime
        self.metrics = metrics
        self.capacity = runtime.cfg.publish_buffer_size
        self.timeout = runtime.cfg.publish_timeout_s
        self.pending = 0  # accepted, not yet durable or failed
        self.capacity_bytes = runtime.cfg.publish_buffer_bytes
        self.pending_bytes = 0
        self._sizes: dict[asyncio.Task[PublishResult], int] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: set[asyncio.Task[PublishResult]] = set()

    async def publish(self, topic: str, messages: list[OutgoingMessage]) -> list[PublishEntryResult]:
        """Publish ``messages`` to ``topic``; one result per message, in order.

        Raises :class:`ApiError` before anything is published when the request as a whole is bad
        (unknown topic, an invalid or oversize message, buffer full, draining).
        """
        self.runtime.producer()  # 503 while starting or draining
        loop = asyncio.get_running_loop()
        # one deadline for the whole request, the topic lookup (S3, with retries) included
        deadline = loop.time() + self.timeout
        if len(messages) > self.capacity:
            raise ApiError(
                413,
                "batch_too_large",
                f"{len(messages)} messages exceed the publish buffer of {self.capacity}: split the batch",
            )
        try:
            async with asyncio.timeout_at(deadline):
                prepared = await self._prepare(topic, messages)
        except TimeoutError:
            self.metrics.publish_errors.labels(topic, "publish_timeout").inc(len(messages))
            raise unavailable(
                "publish_timeout",
                f"the bucket did not answer within {self.timeout:g}s; nothing was published",
            ) from None
        size = sum(p.size for p in prepared)
        if size > self.capacity_bytes:
            raise ApiError(
                413,
                "batch_too_large",
                f"{size} bytes exceed the publish buffer of {self.capacity_bytes} bytes: split the batch",
            )
        if self.pending + len(messages) > self.capacity or self.pending_bytes + size > self.capacity_bytes:
            self.metrics.publish_errors.labels(topic, "buffer_full").inc(len(messages))
            raise ApiError(
                429,
                "buffer_full",
                f"the publish buffer is full ({self.pending} of {self.capacity} messages, "
                f"{self.pending_bytes} of {self.capacity_bytes} bytes pending); "
                f"retry after {RETRY_AFTER_S}s",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        tasks = [self._start(p) for p in prepared]
        outcomes = await asyncio.gather(*(self._bounded(t, deadline) for t in tasks), return_exceptions=True)
        results: list[PublishEntryResult] = []
        for outcome in outcomes:
            if isinstance(outcome, PublishResult):
                self.metrics.published.labels(topic).inc()
                results.append(PublishEntryResult(status=200, result=_response(outcome)))
            else:
                err = from_exception(outcome)
                self.metrics.publish_errors.labels(topic, err.code).inc()
                results.append(PublishEntryResult(status=err.status, error=err.code, message=err.message))
        return results

    async def _prepare(self, topic: str, messages: list[OutgoingMessage]) -> list[PreparedRecord]:
        """Every message built and encoded, once (what is published is exactly this); ApiError
        when the topic or a message is bad."""
        producer = self.runtime.producer()
        try:
            await producer.catalog.config(topic)  # the whole request's error first: unknown topic
        except BucketqError as exc:
            raise from_exception(exc) from None
        problems: list[dict[str, object]] = []
        prepared: list[PreparedRecord] = []
        too_large = False
        for i, m in enumerate(messages):
            try:
                prepared.append(await producer.prepare(topic, m.payload, data=m.data(), options=m.options()))
            except InvalidArgument as exc:
                too_large = too_large or isinstance(exc, MessageTooLarge)
                problems.append({"index": i, "problem": str(exc)})
            except BucketqError as exc:
                raise from_exception(exc) from None
        if not problems:
            return prepared
        what = "message" if len(messages) == 1 else f"{len(problems)} of {len(messages)} messages"
        summary = (
            problems[0]["problem"]
            if len(messages) == 1
            else "; ".join(f"#{p['index']}: {p['problem']}" for p in problems[:5])
        )
        raise ApiError(
            413 if too_large else 400,
            "message_too_large" if too_large else "invalid_message",
            f"{what} rejected, nothing was published: {summary}",
            details=problems,
        )

    def _start(self, prepared: PreparedRecord) -> asyncio.Task[PublishResult]:
        producer = self.runtime.producer()
        task = asyncio.get_running_loop().create_task(producer.publish_prepared(prepared))
        self.pending += 1
        self.pending_bytes += prepared.size
        self._sizes[task] = prepared.size
        self._idle.clear()
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        self.metrics.buffer_depth.set(self.pending)
        return task

    def _finished(self, task: asyncio.Task[PublishResult]) -> None:
        self._tasks.discard(task)
        self.pending -= 1
        self.pending_bytes -= self._sizes.pop(task, 0)
        self.metrics.buffer_depth.set(self.pending)
        if self.pending == 0:
            self._idle.set()
        if not task.cancelled():
            task.exception()  # retrieved: a caller that timed out no longer awaits it

    async def _bounded(self, task: asyncio.Task[PublishResult], deadline: float) -> PublishResult:
        """The task's result, or a timeout at the request's deadline; the publish itself goes on
        (it may still land, so the answer is 503 'publish_timeout', never a denial)."""
        remaining = deadline - asyncio.get_running_loop().time()
        return await asyncio.wait_for(asyncio.shield(task), max(0.0, remaining))

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until every accepted publish is durable or failed; False on timeout."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), max(0.0, timeout))
        return self._idle.is_set()


def _response(r: PublishResult) -> PublishResponse:
    return PublishResponse(
        id=r.id,
        topic=r.topic,
        partition=r.partition,
        seq=r.seq,
        index=r.index,
        offset=r.offset,
        duplicate=r.duplicate,
    )
