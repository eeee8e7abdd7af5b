"""The localhost HTTP API (aiohttp): routes and handlers; the logic lives in publishing/delivery."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from bucketq.api_models import (
    AckBatchRequest,
    AckRequest,
    ExtendBatchRequest,
    ExtendRequest,
    NackBatchRequest,
    NackRequest,
    PublishBatchResponse,
    PullRequest,
    PullResponse,
    SettleBatchResponse,
)
from bucketq.core.producer import publishing_as
from bucketq.sidecar import cloud_events
from bucketq.sidecar.bodies import read_publish, read_publish_batch
from bucketq.sidecar.delivery import Deliveries
from bucketq.sidecar.errors import ApiError, unavailable
from bucketq.sidecar.httputil import (
    LIMITS,
    MAX_BODY,
    BodyLimits,
    auth_middleware,
    error_middleware,
    json_response,
    read_model,
)
from bucketq.sidecar.metrics import CONTENT_TYPE, Metrics
from bucketq.sidecar.publishing import Publisher
from bucketq.sidecar.runtime import Runtime


class Api:
    """Request handlers over the runtime, the publisher and the deliveries."""

    def __init__(
        self, runtime: Runtime, publisher: Publisher, deliveries: Deliveries, metrics: Metrics
    ) -> None:
        self.runtime = runtime
        self.publisher = publisher
        self.deliveries = deliveries
        self.metrics = metrics
        self.cfg = runtime.cfg
        self.push_in_flight = lambda: 0

    # -- publish ---------------------------------------------------------------------------------

    async def publish(self, request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        with self.runtime.tracing.publish(topic, request.headers) as trace:
            message = await read_publish(request, trace)
            # the app's connection is the caller: its requests come one after another
            with publishing_as(request.protocol):
                (entry,) = await self.publisher.publish(topic, [message])
        if entry.result is None:
            err = ApiError(entry.status, entry.error or "publish_failed", entry.message or "publish failed")
            raise unavailable(err.code, err.message) if entry.status == 503 else err
        return json_response(entry.result)

    async def publish_batch(self, request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        with self.runtime.tracing.publish(topic, request.headers) as trace:
            messages = await read_publish_batch(request, trace)
            if len(messages) > self.cfg.max_batch:
                raise ApiError(
                    413,
                    "batch_too_large",
                    f"{len(messages)} messages in one batch; the limit is {self.cfg.max_batch}",
                )
            with publishing_as(request.protocol):
                results = await self.publisher.publish(topic, messages)
        failed = [r for r in results if r.status != 200]
        status = 200
        if failed and len(failed) == len(results) and len({r.status for r in failed}) == 1:
            status = failed[0].status  # all failed alike (e.g. 503 during an outage)
        response = json_response(PublishBatchResponse(results=results, failed=len(failed)), status)
        if status == 503:
            response.headers["Retry-After"] = "1"
        return response

    # -- pull and settle -------------------------------------------------------------------------

    async def pull(self, request: web.Request) -> web.Response:
        body = await read_model(request, PullRequest, empty_ok=True)

        def gone() -> bool:
            transport = request.transport
            return transport is None or transport.is_closing()

        if cloud_events.BATCH in request.headers.get("Accept", ""):
            leased = await self.deliveries.lease(body.max_messages, body.wait_seconds, gone)
            headers, data = cloud_events.batch([cloud_events.to_event(m, receipt=True) for m in leased])
            return web.Response(body=data, headers=headers)
        messages = await self.deliveries.pull(body.max_messages, body.wait_seconds, gone)
        return json_response(PullResponse(messages=messages))

    async def ack(self, request: web.Request) -> web.Response:
        body = await read_model(request, AckRequest)
        return json_response(await self.deliveries.ack(body.receipt))

    async def nack(self, request: web.Request) -> web.Response:
        body = await read_model(request, NackRequest)
        return json_response(
            await self.deliveries.nack(
                body.receipt, requeue=body.requeue, delay=body.delay_seconds, reason=body.reason
            )
        )

    async def extend(self, request: web.Request) -> web.Response:
        body = await read_model(request, ExtendRequest)
        return json_response(await self.deliveries.extend(body.receipt, body.seconds))

    def _check_batch(self, count: int) -> None:
        if count > self.cfg.max_batch:
            raise ApiError(
                413, "batch_too_large", f"{count} entries in one batch; the limit is {self.cfg.max_batch}"
            )

    async def ack_batch(self, request: web.Request) -> web.Response:
        body = await read_model(request, AckBatchRequest, items="receipts")
        self._check_batch(len(body.receipts))
        results = await self.deliveries.batch([(r, self.deliveries.ack(r)) for r in body.receipts])
        return json_response(
            SettleBatchResponse(results=results, failed=sum(r.status != 200 for r in results))
        )

    async def nack_batch(self, request: web.Request) -> web.Response:
        body = await read_model(request, NackBatchRequest, items="entries")
        self._check_batch(len(body.entries))
        calls = [
            (
                e.receipt,
                self.deliveries.nack(e.receipt, requeue=e.requeue, delay=e.delay_seconds, reason=e.reason),
            )
            for e in body.entries
        ]
        results = await self.deliveries.batch(calls)
        return json_response(
            SettleBatchResponse(results=results, failed=sum(r.status != 200 for r in results))
        )

    async def extend_batch(self, request: web.Request) -> web.Response:
        body = await read_model(request, ExtendBatchRequest, items="entries")
        self._check_batch(len(body.entries))
        calls = [(e.receipt, self.deliveries.extend(e.receipt, e.seconds)) for e in body.entries]
        results = await self.deliveries.batch(calls)
        return json_response(
            SettleBatchResponse(results=results, failed=sum(r.status != 200 for r in results))
        )

    # -- operations ------------------------------------------------------------------------------

    async def status(self, request: web.Request) -> web.Response:
        _, info = self.runtime.readiness(detailed=True)
        consumer = self.runtime.current_consumer
        body: dict[str, Any] = {
            **info,
            "consumer": self.cfg.consumer,
            "topics": self.cfg.topics,
            "delivery": self.cfg.delivery,
            "uptime_s": round(time.time() - self.runtime.started_at, 3),
            "publish_pending": self.publisher.pending,
            "publish_capacity": self.publisher.capacity,
            "leases_held": consumer.in_flight if consumer is not None else 0,
            "delivered_unsettled": len(self.deliveries.ledger),
            "push_in_flight": self.push_in_flight(),
        }
        if consumer is not None:
            c = consumer.counters
            body["member"] = consumer.member
            body["counters"] = {
                "delivered": c.delivered,
                "acked": c.acked,
                "nacked": c.nacked,
                "dead_lettered": c.dead_lettered,
                "lease_lost": c.lease_lost,
                "commits": c.commits,
                "conflicts": c.conflicts,
            }
        store = self.runtime.store
        if store is not None:
            body["s3_requests"] = dict(store.stats.requests)
        return web.json_response(body)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "state": self.runtime.state})

    async def readyz(self, request: web.Request) -> web.Response:
        # Unauthenticated and served on the pod IP: only ready or not with a generic reason. The
        # details (bucket, endpoint, error text, topic names) are on the authenticated /v1/status.
        ready, info = self.runtime.readiness()
        return web.json_response(info, status=200 if ready else 503)

    async def metrics_text(self, request: web.Request) -> web.Response:
        self.runtime.readiness()
        consumer = self.runtime.current_consumer
        if consumer is not None:
            self.metrics.leases_held.labels(self.runtime.consumer_name).set(consumer.in_flight)
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


def build_api_app(api: Api, *, token: str | None) -> web.Application:
    """The localhost API: publish, pull, settle, plus probes and metrics."""
    middlewares: list[Middleware] = [error_middleware]
    if token:
        middlewares.append(auth_middleware(token))
    app = web.Application(client_max_size=api.cfg.max_body_bytes, middlewares=middlewares)
    app[MAX_BODY] = api.cfg.max_body_bytes
    app[LIMITS] = BodyLimits(
        max_bytes=api.cfg.max_body_bytes,
        max_values=api.cfg.max_json_values,
        max_depth=api.cfg.max_json_depth,
        max_items=api.cfg.max_batch,
        read_timeout_s=api.cfg.body_timeout_s,
    )
    app.add_routes(
        [
            web.post("/v1/publish/{topic}", api.publish),
            web.post("/v1/publish/{topic}/batch", api.publish_batch),
            web.post("/v1/pull", api.pull),
            web.post("/v1/ack", api.ack),
            web.post("/v1/ack/batch", api.ack_batch),
            web.post("/v1/nack", api.nack),
            web.post("/v1/nack/batch", api.nack_batch),
            web.post("/v1/extend", api.extend),
            web.post("/v1/extend/batch", api.extend_batch),
            web.get("/v1/status", api.status),
        ]
    )
    _add_probes(app, api)
    return app


def build_metrics_app(api: Api) -> web.Application:
    """Probes and metrics for the kubelet and Prometheus (listens on the pod IP)."""
    app = web.Application(middlewares=[error_middleware])
    _add_probes(app, api)
    return app


def _add_probes(app: web.Application, api: Api) -> None:
    app.add_routes(
        [
            web.get("/healthz", api.healthz),
            web.get("/readyz", api.readyz),
            web.get("/metrics", api.metrics_text),
        ]
    )
