"""Push delivery: POST messages to the app with bounded concurrency, keeping leases alive meanwhile.

The app answers SUCCESS, RETRY or DROP: JSON ``{"status": ...}`` (or per message in batch mode
``{"statuses": [{"id": ..., "status": ...}]}``), else by HTTP status: 2xx success, 404 drop,
anything else retry. DROP dead-letters the message (when the topic has a dead-letter topic).
A connection refused means the app is not listening yet: the same delivery is retried, the lease
kept alive, and no delivery is counted.

A RETRY nacks the message with a delay that grows with its delivery count
(:class:`~bucketq.sidecar.backoff.RetryBackoff`): the lease is given up at once and the message is
invisible until the delay has passed, so a waiting retry holds nothing and can never get stuck;
if the nack itself cannot be written, the lease expires and the message comes back all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from bucketq.api_models import PushStatus
from bucketq.core.consumer import Consumer
from bucketq.core.message import Message
from bucketq.errors import BucketqError, Closed, LeaseLost
from bucketq.sidecar.backoff import RetryBackoff
from bucketq.sidecar.delivery import Deliveries
from bucketq.sidecar.errors import ApiError
from bucketq.sidecar.metrics import Metrics
from bucketq.sidecar.push_request import push_request
from bucketq.sidecar.runtime import Runtime

log = logging.getLogger("bucketq.sidecar.push")

STATUSES: frozenset[str] = frozenset({"SUCCESS", "RETRY", "DROP"})


def interpret(http_status: int, body: bytes, ids: Sequence[str]) -> dict[str, PushStatus]:
    """Each message's fate from the app's answer.

    A 2xx whose body is empty, not JSON, or a JSON object without ``status``/``statuses`` is a
    success (the HTTP status speaks). A reply that does try to say something and cannot be
    understood (``{"status": 42}``, a statuses entry without a string id and status, JSON that is
    not an object) is a RETRY, per message: acking on a misread answer would lose the message.
    """
    if http_status == 404:
        return dict.fromkeys(ids, "DROP")
    if not 200 <= http_status < 300:
        return dict.fromkeys(ids, "RETRY")
    if not body.strip():
        return dict.fromkeys(ids, "SUCCESS")
    try:
        reply = json.loads(body)
    except (ValueError, RecursionError):
        return dict.fromkeys(ids, "SUCCESS")  # a 2xx with a body that is no JSON reply at all
    if not isinstance(reply, dict):
        log.warning("app answered JSON that is not an object: retrying")
        return dict.fromkeys(ids, "RETRY")
    if "statuses" in reply:
        return _per_message(reply["statuses"], ids)
    if "status" in reply:
        status = reply["status"]
        if not isinstance(status, str):
            log.warning("app answered a status that is not a string (%.100r): retrying", status)
            return dict.fromkeys(ids, "RETRY")
        return dict.fromkeys(ids, _status(status))
    return dict.fromkeys(ids, "SUCCESS")


def _per_message(entries: Any, ids: Sequence[str]) -> dict[str, PushStatus]:
    """Batch replies: each message by its own entry; a missing, malformed or contradicting entry
    is a RETRY for that message only."""
    if not isinstance(entries, list):
        log.warning("app answered 'statuses' that is not a list: retrying the batch")
        return dict.fromkeys(ids, "RETRY")
    given: dict[str, PushStatus] = {}
    contradicted: set[str] = set()
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        mid, status = entry.get("id"), entry.get("status")
        if not isinstance(mid, str) or not isinstance(status, str):
            if isinstance(mid, str):
                contradicted.add(mid)  # the entry names the message but says nothing usable
            continue
        fate = _status(status)
        if given.setdefault(mid, fate) != fate:
            contradicted.add(mid)
    return {i: "RETRY" if i in contradicted else given.get(i, "RETRY") for i in ids}


def _status(text: str) -> PushStatus:
    upper = text.upper()
    if upper == "SUCCESS":
        return "SUCCESS"
    if upper == "DROP":
        return "DROP"
    if upper != "RETRY":
        log.warning("app answered unknown status %r: retrying the message", text)
    return "RETRY"


# The lease keeper's first retry after a failed extend, and the cap of its backoff (below which a
# visibility timeout divided by KEEPER_TRIES_PER_LEASE brings it): during an S3 brownout each open
# push retries a few times per lease period, not every 50 ms.
KEEPER_RETRY_INITIAL_S = 0.25
KEEPER_RETRY_MAX_S = 5.0
KEEPER_TRIES_PER_LEASE = 4
KEEPER_MIN_SLEEP_S = 0.05
KEEPER_LAST_CHANCE_S = 0.5  # before a lease runs out, a failing keeper tries once more


def keeper_backoff(visibility_timeout_s: float) -> RetryBackoff:
    """The retry schedule of a lease keeper whose extends fail: exponential from 0.25 s, capped
    at ``min(5 s, visibility timeout / 4)`` (at least the initial step), equal jitter."""
    cap = max(KEEPER_RETRY_INITIAL_S, min(KEEPER_RETRY_MAX_S, visibility_timeout_s / KEEPER_TRIES_PER_LEASE))
    return RetryBackoff(KEEPER_RETRY_INITIAL_S, cap, 2.0)


async def keep_leases(consumer: Consumer, messages: list[Message], backoff: RetryBackoff) -> None:
    """Extend the leases of ``messages`` a third of the visibility timeout before each runs out,
    until every one is lost (or the task is cancelled, when the app answered).

    An extend the bucket did not confirm (a storage error or timeout) is retried after
    ``backoff.delay(n)`` for the ``n``-th failure in a row (bounded, jittered), or when the lease
    is due if that comes later, but once more half a second before the nearest lease runs out
    (a brownout that ends then keeps the lease); the first success resets the count. Without it, a lease already
    inside its last third made the keeper retry every 50 ms for as long as S3 failed, per open
    push. A lost lease (:class:`LeaseLost`) ends the keeping of that message.
    """
    vt = consumer.settings.visibility_timeout_s
    live = list(messages)
    failures = 0
    while live:
        due = min(m.lease_until for m in live) - time.time() - vt / 3
        wait = max(KEEPER_MIN_SLEEP_S, due)
        if failures:
            wait = max(wait, backoff.delay(failures))
            # one last try before the nearest lease runs out, however long the backoff
            last_chance = min(m.lease_until for m in live) - time.time() - KEEPER_LAST_CHANCE_S
            if last_chance > KEEPER_MIN_SLEEP_S:
                wait = min(wait, last_chance)
        await asyncio.sleep(wait)
        results = await asyncio.gather(
            *(consumer.extend(m.receipt, vt) for m in live), return_exceptions=True
        )
        kept = []
        unconfirmed = False
        for m, res in zip(live, results, strict=True):
            if isinstance(res, float):
                m.lease_until = res
                kept.append(m)
            elif isinstance(res, LeaseLost):
                log.warning("lease on %s lost while the app handles it", m.id)
            else:
                unconfirmed = True
                kept.append(m)  # the bucket did not answer: try again, after a backoff
        if unconfirmed:
            failures += 1
            log.debug(
                "lease extend failed %d time(s) in a row: retrying in up to %.2fs",
                failures,
                backoff.base(failures),
            )
        else:
            failures = 0
        live = kept


class Pusher:
    """Polls the consumer and POSTs to ``cfg.app_url``; at most ``push_concurrency`` requests open."""

    def __init__(self, runtime: Runtime, deliveries: Deliveries, metrics: Metrics) -> None:
        self.runtime = runtime
        self.deliveries = deliveries
        self.metrics = metrics
        self.cfg = runtime.cfg
        self._sem = asyncio.Semaphore(self.cfg.push_concurrency)
        self._tasks: dict[asyncio.Task[None], list[Message]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._stopping = False
        # read once at startup like the API token: the app can require it on every push
        self._token = self.cfg.push_token()
        self.backoff = RetryBackoff(
            self.cfg.push_retry_initial_s, self.cfg.push_retry_max_s, self.cfg.push_retry_multiplier
        )

    @property
    def in_flight(self) -> int:
        return sum(len(m) for m in self._tasks.values())

    # -- the dispatcher --------------------------------------------------------------------------

    async def run(self) -> None:
        """Dispatch until cancelled (by :meth:`stop`)."""
        await self.runtime.connected.wait()
        consumer = self.runtime.consumer()
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.cfg.push_timeout_s),
            connector=aiohttp.TCPConnector(limit=self.cfg.push_concurrency),
        )
        await self._wait_for_app()
        log.info("pushing to %s (concurrency %d)", self.cfg.app_url, self.cfg.push_concurrency)
        while True:
            await self._sem.acquire()
            try:
                messages = await consumer.poll(max_messages=self.cfg.push_batch_size, wait=1.0)
            except Closed:
                self._sem.release()
                return
            except BucketqError as exc:
                self._sem.release()
                log.warning("poll failed: %s", exc)
                await asyncio.sleep(1.0)
                continue
            except BaseException:
                self._sem.release()
                raise
            if not messages:
                self._sem.release()
                continue
            self.deliveries.delivered(messages)
            task = asyncio.get_running_loop().create_task(self._deliver(consumer, messages))
            self._tasks[task] = messages
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)
        self._sem.release()
        if not task.cancelled() and task.exception() is not None:
            log.error("push delivery failed", exc_info=task.exception())

    async def _wait_for_app(self) -> None:
        """Wait until the app's port accepts connections (the app may start after the sidecar)."""
        last_log = 0.0
        while True:
            try:
                _, writer = await asyncio.open_connection(self.cfg.app_host, self.cfg.app_port)
            except OSError as exc:
                if time.monotonic() - last_log > 10:
                    log.info("waiting for the app at %s: %s", self.cfg.app_url, exc)
                    last_log = time.monotonic()
                await asyncio.sleep(0.2)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return

    # -- one delivery ----------------------------------------------------------------------------

    async def _deliver(self, consumer: Consumer, messages: list[Message]) -> None:
        keeper = asyncio.get_running_loop().create_task(self._keep_alive(consumer, messages))
        started = time.perf_counter()
        try:
            statuses = await self._post(messages)
        except asyncio.CancelledError:
            # shutdown cut the request short: the app did not fail, so the messages go back without
            # a retry delay (another member can take them at once)
            keeper.cancel()
            retry: dict[str, PushStatus] = dict.fromkeys((m.id for m in messages), "RETRY")
            await asyncio.shield(self._settle_all(messages, retry, backoff=False))
            raise
        finally:
            keeper.cancel()
        elapsed = time.perf_counter() - started
        for m in messages:
            self.metrics.push_seconds.labels(m.topic).observe(elapsed)
        await self._settle_all(messages, statuses)

    async def _post(self, messages: list[Message]) -> dict[str, PushStatus]:
        assert self._session is not None
        ids = [m.id for m in messages]
        with self.runtime.tracing.deliver(messages[0].topic, [m.headers for m in messages]) as trace:
            headers, body = push_request(
                messages,
                self.cfg.push_format,
                self.runtime.consumer_name,
                trace,
                batched=self.cfg.push_batch_size > 1,
            )
            if self._token is not None:
                headers["Authorization"] = f"Bearer {self._token}"
            return await self._send(ids, headers, body)

    async def _send(self, ids: list[str], headers: dict[str, str], body: bytes) -> dict[str, PushStatus]:
        assert self._session is not None
        backoff = 0.1
        while True:
            try:
                async with self._session.post(self.cfg.app_url, data=body, headers=headers) as resp:
                    return interpret(resp.status, await resp.read(), ids)
            except aiohttp.ClientConnectorError as exc:  # never reached the app: same delivery again
                if self._stopping:
                    return dict.fromkeys(ids, "RETRY")
                log.warning("app not reachable at %s: %s", self.cfg.app_url, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            except (TimeoutError, aiohttp.ClientError) as exc:
                log.warning("push to %s failed (%s): the message will be retried", self.cfg.app_url, exc)
                return dict.fromkeys(ids, "RETRY")

    async def _settle_all(
        self, messages: list[Message], statuses: dict[str, PushStatus], *, backoff: bool = True
    ) -> None:
        await asyncio.gather(
            *(self._settle(m, statuses.get(m.id, "RETRY"), backoff=backoff) for m in messages)
        )

    async def _settle(self, msg: Message, status: PushStatus, *, backoff: bool = True) -> None:
        self.metrics.push_outcomes.labels(msg.topic, status.lower()).inc()
        try:
            if status == "SUCCESS":
                await self.deliveries.ack(msg.receipt)
            elif status == "DROP":
                await self.deliveries.nack(msg.receipt, requeue=False, reason="dropped by the app")
            else:
                # msg.deliveries counts this failed attempt: 1 after the first push
                delay = self.backoff.delay(msg.deliveries) if backoff else 0.0
                log.debug("push of %s failed (delivery %d): retry in %.2fs", msg.id, msg.deliveries, delay)
                await self.deliveries.nack(msg.receipt, requeue=True, delay=delay)
        except ApiError as exc:
            log.warning("could not settle %s (%s) after push: %s", msg.id, status, exc.message)

    async def _keep_alive(self, consumer: Consumer, messages: list[Message]) -> None:
        """Extend the leases while the app's request is open."""
        await keep_leases(consumer, messages, keeper_backoff(consumer.settings.visibility_timeout_s))

    # -- shutdown --------------------------------------------------------------------------------

    async def stop(self, dispatcher: asyncio.Task[None] | None, grace: float) -> None:
        """Stop dispatching; let open requests finish for ``grace`` seconds, then requeue the rest."""
        if dispatcher is not None:
            dispatcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await dispatcher
        self._stopping = True
        tasks = list(self._tasks)
        if tasks:
            log.info("waiting up to %.1fs for %d push requests", grace, len(tasks))
            _, pending = await asyncio.wait(tasks, timeout=max(0.0, grace))
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
