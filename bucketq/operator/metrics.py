"""Queue metrics for Prometheus and KEDA: per topic and consumer, from the last status refresh.

Scrapes never touch S3: the status timers store snapshots here and the collector renders them.
The same port serves KEDA's ``metrics-api`` scaler from the same snapshots (:mod:`.scaling`).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Iterator, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from bucketq import __version__
from bucketq.core.app import FORMAT
from bucketq.core.gc import TopicStorage
from bucketq.core.stats import SubscriptionStats
from bucketq.operator.scaling import (
    ROUTE,
    PersistedLoad,
    SubscriptionLoad,
    persisted_loads,
    scaling_handler,
)
from bucketq.operator.topics import TopicFigures
from bucketq.storage.checks import StoreReport

_TOPIC = ["namespace", "topic"]
# the kinds of objects garbage collection counts (bucketq_gc_deleted_objects{kind})
GC_KINDS = ("segments", "deltas", "checkpoints", "members", "dedup_markers", "probes", "claims")
_SUB = ["namespace", "topic", "consumer"]


class QueueMetrics(Collector):
    """Every metric the operator exports, in a private registry."""

    def __init__(self) -> None:
        self._topics: dict[tuple[str, str], TopicFigures] = {}
        self._retired: set[tuple[str, str]] = set()  # deleted topics (forget_topic), until revived
        # each Consumer's status.scaling as last seen through the watch: (loads, refreshed at)
        self._persisted: dict[tuple[str, str], tuple[list[PersistedLoad], float]] = {}
        self._refreshed: dict[tuple[str, str], float] = {}  # Unix time of each topic's snapshot
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.build_info = Gauge(
            "bucketq_build_info",
            "Always 1: the running version, its Python and the storage format it speaks.",
            ["version", "python", "format"],
            registry=r,
        )
        self.build_info.labels(__version__, platform.python_version(), str(FORMAT)).set(1)
        self.reconcile_errors = Counter(
            "bucketq_operator_reconcile_errors",
            "Failed reconciliations, by kind and reason.",
            ["kind", "reason"],
            registry=r,
        )
        self.reconciles = Counter(
            "bucketq_operator_reconciles",
            "Reconciliations, by kind and result.",
            ["kind", "result"],
            registry=r,
        )
        self.gc_deleted = Counter(
            "bucketq_gc_deleted_objects",
            "Objects deleted by retention and garbage collection.",
            ["namespace", "topic", "kind"],
            registry=r,
        )
        self.storage_reachable = Gauge(
            "bucketq_storage_reachable",
            "1 when the last storage call of a namespace succeeded.",
            ["namespace"],
            registry=r,
        )
        self.stored_bytes = Gauge(
            "bucketq_topic_stored_bytes",
            "Bytes of the topic's stored segments, at its last garbage collection.",
            _TOPIC,
            registry=r,
        )
        self.stored_segments = Gauge(
            "bucketq_topic_stored_segments",
            "The topic's stored segments, at its last garbage collection.",
            _TOPIC,
            registry=r,
        )
        self.held_for_lagging = Gauge(
            "bucketq_topic_segments_held_for_lagging",
            "Segments past the topic's retention kept only because a subscription has not consumed them.",
            _TOPIC,
            registry=r,
        )
        self.store_check_passed = Gauge(
            "bucketq_store_check_passed",
            "1 when the store passed the check at operator start, 0 when it failed (bucketq doctor).",
            ["check"],
            registry=r,
        )
        r.register(self)

    def set_store_checks(self, report: StoreReport) -> None:
        """The verdicts of the store checks (a skipped check has no series)."""
        for check in report.checks:
            if check.verdict != "skip":
                self.store_check_passed.labels(check.name).set(0 if check.failed else 1)

    def set_storage(self, namespace: str, topic: str, stored: TopicStorage) -> None:
        """What a topic stores, as its last garbage collection counted it (ignored for a topic
        forgotten since: a collection that was running when its Topic was deleted)."""
        if (namespace, topic) in self._retired:
            return
        self.stored_bytes.labels(namespace, topic).set(stored.bytes)
        self.stored_segments.labels(namespace, topic).set(stored.segments)
        self.held_for_lagging.labels(namespace, topic).set(stored.held_for_lagging)

    # -- snapshots -------------------------------------------------------------------------------

    def set_topic(
        self, namespace: str, topic: str, figures: TopicFigures, *, at: float | None = None
    ) -> None:
        """Keep a topic's figures for scrapes and scaling answers; ``at``: when they were computed
        (Unix time, default now), so that an answer can say how old its figures are."""
        if (namespace, topic) in self._retired:
            return
        self._topics[(namespace, topic)] = figures
        self._refreshed[(namespace, topic)] = time.time() if at is None else at

    def forget_topic(self, namespace: str, topic: str, *also: str) -> None:
        """Drop every series of ``topic`` (and of the topics in ``also``: its default dead-letter
        topic, which its garbage collection counts) when its Topic is deleted.

        Invariant: no series of a deleted topic is exported after its deletion began (else they
        would stay until the operator restarts, and grow with every topic ever created). The
        topics stay retired, their late snapshots ignored, until :meth:`revive`: a refresh or
        collection that was running when the deletion began cannot bring them back.
        """
        for name in (topic, *also):
            key = (namespace, name)
            self._retired.add(key)
            self._topics.pop(key, None)
            self._refreshed.pop(key, None)
            for gauge in (self.stored_bytes, self.stored_segments, self.held_for_lagging):
                gauge.remove(namespace, name)
            for kind in GC_KINDS:
                self.gc_deleted.remove(namespace, name, kind)

    def revive(self, namespace: str, topic: str) -> None:
        """A Topic of that name is reconciled (again): its series may be exported."""
        self._retired.discard((namespace, topic))

    def forget_consumer(self, namespace: str, consumer: str) -> None:
        """Drop the consumer's series from every topic's snapshot when its Consumer is deleted.

        A subscription left in the bucket (deletionPolicy Retain) still holds its topic's data
        and reappears with the topic's next refresh; one deleted with the Consumer does not.
        """
        self.forget_scaling(namespace, consumer)
        for (ns, topic), figures in list(self._topics.items()):
            if ns == namespace and any(s.consumer == consumer for s in figures.subscriptions):
                kept = [s for s in figures.subscriptions if s.consumer != consumer]
                self._topics[(ns, topic)] = TopicFigures(figures.info, kept)

    def consumer_figures(
        self, namespace: str, consumer: str
    ) -> tuple[list[tuple[SubscriptionLoad, float]], str]:
        """Every subscription of ``consumer`` in ``namespace`` with the Unix time of its snapshot,
        from this operator's refreshes (``refresh``), else as last persisted in the Consumer's
        status (``status``: right after a start, or on a standby replica)."""
        live: list[tuple[SubscriptionLoad, float]] = [
            (sub, self._refreshed[key])
            for key, figures in sorted(self._topics.items())
            if key[0] == namespace
            for sub in figures.subscriptions
            if sub.consumer == consumer
        ]
        if live:
            return live, "refresh"
        persisted = self._persisted.get((namespace, consumer))
        if persisted is None:
            return [], "status"
        loads, at = persisted
        return [(load, at) for load in loads], "status"

    def remember_scaling(self, namespace: str, consumer: str, scaling: Mapping[str, Any] | None) -> None:
        """Keep a Consumer's persisted ``status.scaling`` (what every watch event of it carries)."""
        found = persisted_loads(scaling)
        if found is None:
            self._persisted.pop((namespace, consumer), None)
        else:
            self._persisted[(namespace, consumer)] = found

    def forget_scaling(self, namespace: str, consumer: str) -> None:
        """The Consumer is gone: no figures of it are answered any more."""
        self._persisted.pop((namespace, consumer), None)

    def subscription(self, namespace: str, topic: str, consumer: str) -> SubscriptionStats | None:
        figures = self._topics.get((namespace, topic))
        for sub in figures.subscriptions if figures else ():
            if sub.consumer == consumer:
                return sub
        return None

    # -- exposition ------------------------------------------------------------------------------

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        g = {
            "backlog": GaugeMetricFamily(
                "bucketq_subscription_backlog",
                "Messages visible or delayed, not leased, not done.",
                labels=_SUB,
            ),
            "in_flight": GaugeMetricFamily(
                "bucketq_subscription_in_flight", "Messages leased to a member right now.", labels=_SUB
            ),
            "pending": GaugeMetricFamily(
                "bucketq_subscription_pending",
                "Messages not yet done: backlog plus in flight (prefetched messages are leased).",
                labels=_SUB,
            ),
            "delayed": GaugeMetricFamily(
                "bucketq_subscription_delayed", "Messages waiting for their not-before time.", labels=_SUB
            ),
            "oldest": GaugeMetricFamily(
                "bucketq_subscription_oldest_message_age_seconds",
                "Age of the oldest message not yet done (0 when none).",
                labels=_SUB,
            ),
        }
        c = {
            "dead": CounterMetricFamily(
                "bucketq_subscription_dead_lettered", "Messages moved to the dead-letter topic.", labels=_SUB
            ),
            "acked": CounterMetricFamily("bucketq_subscription_acked", "Messages acknowledged.", labels=_SUB),
            "redelivered": CounterMetricFamily(
                "bucketq_subscription_redelivered", "Deliveries of messages delivered before.", labels=_SUB
            ),
            "published": CounterMetricFamily(
                "bucketq_topic_published_messages", "Messages ever published to the topic.", labels=_TOPIC
            ),
        }
        partitions = GaugeMetricFamily("bucketq_topic_partitions", "Partitions of the topic.", labels=_TOPIC)
        holders = GaugeMetricFamily(
            "bucketq_consumer_lease_holders",
            "Distinct members holding a live lease on any of the consumer's topics (a scaler's floor).",
            labels=["namespace", "consumer"],
        )
        members: dict[tuple[str, str], set[str]] = {}
        for (ns, topic), figures in sorted(self._topics.items()):
            c["published"].add_metric([ns, topic], figures.info.messages)
            partitions.add_metric([ns, topic], figures.info.config.partitions)
            for sub in figures.subscriptions:
                labels = [ns, topic, sub.consumer]
                g["backlog"].add_metric(labels, sub.backlog)
                g["in_flight"].add_metric(labels, sub.in_flight)
                g["pending"].add_metric(labels, sub.pending)
                g["delayed"].add_metric(labels, sub.delayed)
                g["oldest"].add_metric(labels, sub.oldest_age_s or 0.0)
                c["dead"].add_metric(labels, sub.dead_lettered)
                c["acked"].add_metric(labels, sub.acked)
                c["redelivered"].add_metric(labels, sub.redelivered)
                members.setdefault((ns, sub.consumer), set()).update(sub.holders)
        for (ns, consumer), holding in sorted(members.items()):
            holders.add_metric([ns, consumer], len(holding))
        yield from g.values()
        yield from c.values()
        yield partitions
        yield holders

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- server ----------------------------------------------------------------------------------

    async def serve(self, host: str, port: int) -> web.AppRunner:
        """Serve ``GET /metrics`` and KEDA's ``GET /scaling/{namespace}/{consumer}`` on ``host:port``;
        returns the runner to clean up."""

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(body=self.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get(ROUTE, scaling_handler(self))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        return runner
