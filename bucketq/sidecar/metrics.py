"""The sidecar's Prometheus metrics (prometheus-client, a private registry, names prefixed ``bucketq_``)."""

from __future__ import annotations

import platform

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from bucketq import __version__
from bucketq.core.app import FORMAT
from bucketq.core.hooks import CommitCounts

CONTENT_TYPE = CONTENT_TYPE_LATEST
_MSG = ("topic", "consumer")
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


class Metrics:
    """Every metric the sidecar exports. One instance per process (tests may make several)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.published = Counter(
            "bucketq_messages_published", "Messages published and durable.", ["topic"], registry=r
        )
        self.publish_errors = Counter(
            "bucketq_publish_errors", "Publishes that failed, by error code.", ["topic", "error"], registry=r
        )
        self.delivered = Counter(
            "bucketq_messages_delivered", "Messages handed to the app (pull or push).", _MSG, registry=r
        )
        self.redelivered = Counter(
            "bucketq_messages_redelivered",
            "Deliveries of messages that were delivered before.",
            _MSG,
            registry=r,
        )
        self.acked = Counter("bucketq_messages_acked", "Messages acknowledged.", _MSG, registry=r)
        self.nacked = Counter(
            "bucketq_messages_nacked", "Messages given back for redelivery.", _MSG, registry=r
        )
        self.dead_lettered = Counter(
            "bucketq_messages_dead_lettered",
            "Messages moved to the dead-letter topic, by source (app or janitor).",
            [*_MSG, "source"],
            registry=r,
        )
        self.lease_lost = Counter(
            "bucketq_lease_lost", "Settlements refused because the lease was stale.", _MSG, registry=r
        )
        self.expired = Counter(
            "bucketq_leases_expired",
            "Delivered messages the app let expire without settling them.",
            _MSG,
            registry=r,
        )
        self.commit_ops = Histogram(
            "bucketq_commit_batch_size",
            "Ops per cursor delta (group commit size).",
            _MSG,
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.commit_seconds = Histogram(
            "bucketq_commit_duration_seconds",
            "Duration of a group-commit cycle.",
            _MSG,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.commit_conflicts = Counter(
            "bucketq_commit_conflicts", "Cursor delta writes that lost the race (HTTP 412).", _MSG, registry=r
        )
        self.commit_rebases = Counter(
            "bucketq_commit_rebases", "Commits re-validated against a newer cursor state.", _MSG, registry=r
        )
        self.s3_requests = Counter(
            "bucketq_s3_requests",
            "Object store requests by operation, status and kind of object (segment, delta, head...).",
            ["op", "status", "kind"],
            registry=r,
        )
        self.s3_seconds = Histogram(
            "bucketq_s3_request_duration_seconds",
            "Object store request latency.",
            ["op"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.leases_held = Gauge(
            "bucketq_leases_held",
            "Leases this member holds (prefetched + delivered).",
            ["consumer"],
            registry=r,
        )
        self.buffer_depth = Gauge(
            "bucketq_publish_buffer_depth",
            "Messages accepted for publishing and not yet durable.",
            registry=r,
        )
        self.buffer_capacity = Gauge(
            "bucketq_publish_buffer_capacity", "Bound of the publish buffer (429 above it).", registry=r
        )
        self.push_seconds = Histogram(
            "bucketq_push_duration_seconds",
            "Duration of push requests to the app.",
            ["topic"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.push_outcomes = Counter(
            "bucketq_push_deliveries",
            "Push deliveries by the app's answer (success, retry, drop, error).",
            ["topic", "outcome"],
            registry=r,
        )
        self.ready = Gauge(
            "bucketq_sidecar_ready", "1 when the sidecar is connected and serving.", registry=r
        )
        self.draining = Gauge(
            "bucketq_sidecar_draining", "1 while the sidecar drains for shutdown.", registry=r
        )
        # constant 1: its labels say which release runs and which bucket format it speaks, so that
        # a dashboard can spot mixed versions during a rollout
        self.build_info = Gauge(
            "bucketq_build_info",
            "Always 1; the labels name the bucketq version, Python version and storage format.",
            ["version", "python", "format"],
            registry=r,
        )
        self.build_info.labels(__version__, platform.python_version(), str(FORMAT)).set(1)

    def prepare(self, consumer: str, topics: list[str], *, push: bool) -> None:
        """Create the labelled series of a consumer up front, so that they read 0 before any traffic."""
        self.leases_held.labels(consumer).set(0)
        for topic in topics:
            for metric in (
                self.delivered,
                self.redelivered,
                self.acked,
                self.nacked,
                self.lease_lost,
                self.expired,
                self.commit_conflicts,
                self.commit_rebases,
            ):
                metric.labels(topic, consumer)
            self.dead_lettered.labels(topic, consumer, "app")
            self.dead_lettered.labels(topic, consumer, "max_deliveries")
            if push:
                self.push_seconds.labels(topic)
                for outcome in ("success", "retry", "drop"):
                    self.push_outcomes.labels(topic, outcome)

    def observe_s3(self, op: str, status: str, seconds: float, kind: str = "other") -> None:
        self.s3_requests.labels(op, status, kind).inc()
        self.s3_seconds.labels(op).observe(seconds)

    def observe_commit(self, consumer: str, topic: str, result: CommitCounts, seconds: float) -> None:
        self.commit_ops.labels(topic, consumer).observe(result.ops)
        self.commit_seconds.labels(topic, consumer).observe(seconds)
        if result.conflicts:
            self.commit_conflicts.labels(topic, consumer).inc(result.conflicts)
            self.commit_rebases.labels(topic, consumer).inc()
        if result.dead_lettered:
            self.dead_lettered.labels(topic, consumer, "max_deliveries").inc(result.dead_lettered)

    def render(self) -> bytes:
        return generate_latest(self.registry)
