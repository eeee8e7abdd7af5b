"""The consumer side for the app: pull, ack/nack/extend by receipt, and the expired-lease reaper."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from bucketq.api_models import DeliveredMessage, Outcome, SettleEntryResult, SettleResponse
from bucketq.core.consumer import Consumer
from bucketq.core.message import Message, Receipt
from bucketq.errors import BucketqError, LeaseLost
from bucketq.sidecar.errors import ApiError, from_exception, unavailable
from bucketq.sidecar.metrics import Metrics
from bucketq.sidecar.runtime import Runtime

log = logging.getLogger("bucketq.sidecar")

T = TypeVar("T")
REAP_EVERY_S = 1.0
REAP_MARGIN_S = 1.0


def to_wire(msg: Message, *, with_receipt: bool) -> DeliveredMessage:
    """The JSON form of a leased message (``payload``, or ``data_b64`` for raw bytes)."""
    data = msg.data
    return DeliveredMessage(
        id=msg.id,
        topic=msg.topic,
        partition=msg.partition,
        seq=msg.seq,
        index=msg.index,
        offset=msg.offset,
        key=msg.key,
        headers=dict(msg.headers),
        payload=msg.payload if data is None else None,
        data_b64=base64.b64encode(data).decode() if data is not None else None,
        content_type=msg.content_type,
        created_at=msg.created_at,
        producer_id=msg.producer_id,
        priority=msg.priority,
        deliveries=msg.deliveries,
        receipt=msg.receipt if with_receipt else None,
        lease_until=msg.lease_until if with_receipt else None,
    )


class Ledger:
    """Messages delivered to the app and not settled yet: receipt -> (topic, lease deadline)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[str, float]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, msg: Message) -> None:
        self._entries[msg.receipt] = (msg.topic, msg.lease_until)

    def forget(self, receipt: str) -> None:
        self._entries.pop(receipt, None)

    def extend(self, receipt: str, until: float) -> None:
        entry = self._entries.get(receipt)
        if entry is not None:
            self._entries[receipt] = (entry[0], until)

    def expired(self, now: float) -> list[tuple[str, str]]:
        """(receipt, topic) of leases past their deadline."""
        return [(r, t) for r, (t, until) in self._entries.items() if until < now]

    def receipts(self) -> list[str]:
        return list(self._entries)


class Deliveries:
    """Hands messages to the app and settles them; every settlement is bounded by a timeout."""

    def __init__(self, runtime: Runtime, metrics: Metrics) -> None:
        self.runtime = runtime
        self.metrics = metrics
        self.cfg = runtime.cfg
        self.ledger = Ledger()
        self._inflight: dict[tuple[str, str], asyncio.Task[Any]] = {}

    # -- pull ------------------------------------------------------------------------------------

    async def pull(
        self, max_messages: int, wait: float, gone: Callable[[], bool] = lambda: False
    ) -> list[DeliveredMessage]:
        """:meth:`lease` in the API's JSON form."""
        return [to_wire(m, with_receipt=True) for m in await self.lease(max_messages, wait, gone)]

    async def lease(
        self, max_messages: int, wait: float, gone: Callable[[], bool] = lambda: False
    ) -> list[Message]:
        """Up to ``max_messages`` leased messages, waiting up to ``wait`` seconds for the first.

        ``gone()`` tells whether the asking request was abandoned (the client hung up during the
        long poll): its messages then go back at once, uncounted, instead of waiting out a lease
        nobody will settle and coming back with one delivery more.
        """
        if self.cfg.delivery == "push":
            raise ApiError(400, "pull_disabled", "this sidecar delivers by push (delivery mode 'push')")
        if max_messages > self.cfg.max_batch:
            raise ApiError(400, "invalid_request", f"max_messages must be at most {self.cfg.max_batch}")
        if wait > self.cfg.max_wait_s:
            raise ApiError(400, "invalid_request", f"wait_seconds must be at most {self.cfg.max_wait_s:g}")
        if self.runtime.draining:
            raise unavailable("draining", "the sidecar is shutting down and delivers no more messages")
        consumer = self.runtime.consumer()
        try:
            messages = await consumer.poll(max_messages=max_messages, wait=wait)
        except BucketqError as exc:
            raise from_exception(exc) from None
        if messages and gone():
            await self._release_uncounted(consumer, messages)
            log.info("pull request abandoned: gave back %d messages uncounted", len(messages))
            raise ApiError(499, "client_gone", "the client closed the connection before the answer")
        self.delivered(messages)
        for m in messages:
            self.ledger.add(m)
        return messages

    async def _release_uncounted(self, consumer: Consumer, messages: Sequence[Message]) -> None:
        """Give back messages the app never saw; one that cannot be released now expires instead."""

        async def one(receipt: str) -> None:
            with contextlib.suppress(BucketqError, ApiError):
                await self._once("release", receipt, lambda: consumer.release(receipt))

        await asyncio.gather(*(one(m.receipt) for m in messages))

    def delivered(self, messages: Sequence[Message]) -> None:
        name = self.runtime.consumer_name
        for m in messages:
            self.metrics.delivered.labels(m.topic, name).inc()
            if m.deliveries > 1:
                self.metrics.redelivered.labels(m.topic, name).inc()

    # -- settle ----------------------------------------------------------------------------------

    def _topic_of(self, receipt: str) -> str:
        try:
            topic = Receipt.decode(receipt).topic
        except BucketqError as exc:
            raise from_exception(exc) from None
        if topic not in self.cfg.topics:
            raise ApiError(
                400,
                "invalid_receipt",
                f"receipt names topic {topic!r}, which this sidecar does not consume: "
                "pass the receipt exactly as it was delivered",
            )
        return topic

    async def _once(self, kind: str, receipt: str, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run ``make()`` once per (kind, receipt) at a time, bounded by the settle timeout.

        The operation itself is shielded: after a timeout it still completes in the background, and
        a retry with the same receipt joins it instead of racing it.
        """
        key = (kind, receipt)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(make())
            self._inflight[key] = task
            task.add_done_callback(lambda t: self._done(key, t))
        try:
            result: T = await asyncio.wait_for(asyncio.shield(task), self.cfg.settle_timeout_s)
        except TimeoutError:
            raise unavailable(
                "settle_timeout",
                f"the bucket did not confirm the {kind} within {self.cfg.settle_timeout_s:g}s; it is queued "
                "and will apply when the bucket answers; retry with the same receipt",
            ) from None
        return result

    def _done(self, key: tuple[str, str], task: asyncio.Task[Any]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()

    async def _settle(self, kind: str, receipt: str, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        topic = self._topic_of(receipt)
        consumer = self.runtime.consumer()
        if not consumer.knows(receipt):
            # Not a lease this member holds nor one it settled lately: refused here, before any
            # bucket request or cursor delta, so forged or stale receipts cost nothing.
            self.ledger.forget(receipt)
            self.metrics.lease_lost.labels(topic, self.runtime.consumer_name).inc()
            raise ApiError(
                409,
                "lease_lost",
                "this sidecar holds no lease for the receipt: it expired, was settled, or was "
                "delivered by another sidecar; the message may be redelivered",
            )
        try:
            result = await self._once(kind, receipt, make)
        except LeaseLost as exc:
            self.ledger.forget(receipt)
            self.metrics.lease_lost.labels(topic, self.runtime.consumer_name).inc()
            raise from_exception(exc) from None
        except BucketqError as exc:
            raise from_exception(exc) from None
        return result

    async def ack(self, receipt: str) -> SettleResponse:
        consumer = self.runtime.consumer()
        await self._settle("ack", receipt, lambda: consumer.ack(receipt))
        self.ledger.forget(receipt)
        self.metrics.acked.labels(self._topic_of(receipt), self.runtime.consumer_name).inc()
        return SettleResponse(receipt=receipt, outcome="acked")

    async def nack(
        self, receipt: str, *, requeue: bool = True, delay: float = 0.0, reason: str | None = None
    ) -> SettleResponse:
        consumer = self.runtime.consumer()
        why = reason or ("nack" if requeue else "rejected by the app")
        await self._settle(
            "nack", receipt, lambda: consumer.nack(receipt, requeue=requeue, delay=delay, reason=why)
        )
        self.ledger.forget(receipt)
        topic, name = self._topic_of(receipt), self.runtime.consumer_name
        if requeue:
            self.metrics.nacked.labels(topic, name).inc()
            return SettleResponse(receipt=receipt, outcome="nacked")
        self.metrics.dead_lettered.labels(topic, name, "app").inc()
        return SettleResponse(receipt=receipt, outcome="dead_lettered")

    async def extend(self, receipt: str, seconds: float) -> SettleResponse:
        consumer = self.runtime.consumer()
        until = await self._settle("extend", receipt, lambda: consumer.extend(receipt, seconds))
        self.ledger.extend(receipt, until)
        return SettleResponse(receipt=receipt, outcome="extended", lease_until=until)

    async def batch(self, calls: Sequence[tuple[str, Awaitable[SettleResponse]]]) -> list[SettleEntryResult]:
        """Run settlements concurrently; each entry reports its own status (409 for a stale receipt)."""
        outcomes = await asyncio.gather(*(c for _, c in calls), return_exceptions=True)
        results = []
        for (receipt, _), outcome in zip(calls, outcomes, strict=True):
            if isinstance(outcome, SettleResponse):
                out: Outcome = outcome.outcome
                results.append(
                    SettleEntryResult(
                        receipt=receipt, status=200, outcome=out, lease_until=outcome.lease_until
                    )
                )
            else:
                err = from_exception(outcome)
                results.append(
                    SettleEntryResult(receipt=receipt, status=err.status, error=err.code, message=err.message)
                )
        return results

    # -- expired leases and shutdown -------------------------------------------------------------

    async def reap_forever(self) -> None:
        """Forget messages whose lease the app let expire (the engine redelivers them) and count them."""
        while True:
            await asyncio.sleep(REAP_EVERY_S)
            for receipt, topic in self.ledger.expired(time.time() - REAP_MARGIN_S):
                self.ledger.forget(receipt)
                self.metrics.expired.labels(topic, self.runtime.consumer_name).inc()

    async def wait_settled(self, timeout: float) -> bool:
        """Wait until the app settled everything it pulled (or the leases expired); False on timeout."""
        deadline = time.monotonic() + timeout
        while len(self.ledger) or self._inflight:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def release_unsettled(self) -> int:
        """Requeue what the app still holds (it will be redelivered); returns how many."""
        consumer = self.runtime.current_consumer
        receipts = self.ledger.receipts()
        if consumer is None or not receipts:
            return 0
        await asyncio.gather(*(self._give_back(consumer, r) for r in receipts))
        return len(receipts)

    async def _give_back(self, consumer: Consumer, receipt: str) -> None:
        """Requeue one message the app holds; a lease already lost needs nothing."""
        self.ledger.forget(receipt)
        with contextlib.suppress(BucketqError, ApiError):
            await self._once("nack", receipt, lambda: consumer.nack(receipt, requeue=True))
