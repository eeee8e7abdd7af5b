"""Queue metrics for Prometheus and KEDA: per topic and consumer, from the last status refresh.

Scrapes never touch S3: the status timers store snapshots here and the collector renders them.
"""

from __future__ import annotations

from collections.abc import Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from bucketq.core.gc import TopicStorage
from bucketq.core.stats import SubscriptionStats
from bucketq.operator.topics import TopicFigures

_TOPIC = ["namespace", "topic"]
_SUB = ["namespace", "topic", "consumer"]


class QueueMetrics(Collector):
    """Every metric the operator exports, in a private registry."""

    def __init__(self) -> None:
        self._topics: dict[tuple[str, str], TopicFigures] = {}
        r = self.registry = CollectorRegistry(auto_describe=True)
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
        r.register(self)

    def set_storage(self, namespace: str, topic: str, stored: TopicStorage) -> None:
        """What a topic stores, as its last garbage collection counted it."""
        self.stored_bytes.labels(namespace, topic).set(stored.bytes)
        self.stored_segments.labels(namespace, topic).set(stored.segments)
        self.held_for_lagging.labels(namespace, topic).set(stored.held_for_lagging)

    # -- snapshots -------------------------------------------------------------------------------

    def set_topic(self, namespace: str, topic: str, figures: TopicFigures) -> None:
        self._topics[(namespace, topic)] = figures

    def forget_topic(self, namespace: str, topic: str) -> None:
        self._topics.pop((namespace, topic), None)

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
        for (ns, topic), figures in sorted(self._topics.items()):
            c["published"].add_metric([ns, topic], figures.info.messages)
            partitions.add_metric([ns, topic], figures.info.config.partitions)
            for sub in figures.subscriptions:
                labels = [ns, topic, sub.consumer]
                g["backlog"].add_metric(labels, sub.backlog)
                g["in_flight"].add_metric(labels, sub.in_flight)
                g["delayed"].add_metric(labels, sub.delayed)
                g["oldest"].add_metric(labels, sub.oldest_age_s or 0.0)
                c["dead"].add_metric(labels, sub.dead_lettered)
                c["acked"].add_metric(labels, sub.acked)
                c["redelivered"].add_metric(labels, sub.redelivered)
        yield from g.values()
        yield from c.values()
        yield partitions

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- server ----------------------------------------------------------------------------------

    async def serve(self, host: str, port: int) -> web.AppRunner:
        """Serve ``GET /metrics`` on ``host:port``; returns the runner to clean up."""

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(body=self.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        return runner
