"""Series are forgotten with their Topic and Consumer (issue 23, finding 6): an operator in the
Kubernetes emulator, its real /metrics output, a moto bucket.

Invariant: once a Topic's deletion began, no series labelled with it (or with its default
dead-letter topic) is exported; once a Consumer's deletion began (deletionPolicy Delete), none of
its subscription series. A Topic created again under the same name exports its series again.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.operator.harness import Kube, fast_settings, start_operator, wait_for
from tests.operator.k8s_emulator import EmulatorThread
from tests.operator.test_consumers import consumer, metrics_text, publish
from tests.operator.test_topics import ready, topic
from tests.support.servers import S3Server, free_ports

pytestmark = pytest.mark.s3  # the operator reconciles against the moto server

STORAGE = (
    "bucketq_topic_stored_bytes",
    "bucketq_topic_stored_segments",
    "bucketq_topic_segments_held_for_lagging",
)


def series(port: int) -> list[tuple[str, dict[str, str]]]:
    """Every (sample name, labels) the operator's /metrics exports now."""
    return [
        (s.name, dict(s.labels))
        for family in text_string_to_metric_families(metrics_text(port))
        for s in family.samples
    ]


def labelled(port: int, namespace: str, **labels: str) -> list[tuple[str, dict[str, str]]]:
    """The series of ``namespace`` carrying every one of ``labels``."""
    return [
        (name, found)
        for name, found in series(port)
        if found.get("namespace") == namespace and all(found.get(k) == v for k, v in labels.items())
    ]


def names(found: list[tuple[str, dict[str, Any]]]) -> set[str]:
    return {name for name, _ in found}


def test_deleted_topics_and_consumers_leave_no_series(
    emulator: EmulatorThread, kube: Kube, moto_server: S3Server
) -> None:
    ns = kube.namespace("forget")
    engine = moto_server.settings(strategy="conditional_write")
    (port,) = free_ports(1)
    running = start_operator(
        emulator.url,
        engine,
        fast_settings([ns], gc_interval_s=0.5, metrics_host="127.0.0.1", metrics_port=port),
    )
    try:
        kube.create(topic(ns, "orders", deletionPolicy="Delete"))
        kube.create(consumer(ns, "billing", topics=["orders"], deletionPolicy="Delete"))
        kube.create(consumer(ns, "audit", topics=["orders"], deletionPolicy="Delete"))
        wait_for(lambda: ready(kube, "consumers", ns, "billing"), "Consumer billing to be Ready")
        wait_for(lambda: ready(kube, "consumers", ns, "audit"), "Consumer audit to be Ready")
        publish(engine, ns, "orders", 3)

        def everything_exported() -> bool:
            topic_series = names(labelled(port, ns, topic="orders"))
            return (
                set(STORAGE) <= topic_series
                and "bucketq_subscription_backlog" in names(labelled(port, ns, consumer="billing"))
                and "bucketq_subscription_backlog" in names(labelled(port, ns, consumer="audit"))
                and set(STORAGE) <= names(labelled(port, ns, topic="orders.dlq"))
            )

        wait_for(everything_exported, "storage, subscription and GC series of orders and orders.dlq")

        kube.delete("consumers", ns, "billing")
        wait_for(lambda: kube.get("consumers", ns, "billing") is None, "Consumer billing to be deleted")
        assert labelled(port, ns, consumer="billing") == [], "the deleted consumer's series stay"
        assert labelled(port, ns, consumer="audit"), "the other consumer's series went too"

        kube.delete("topics", ns, "orders")
        wait_for(lambda: kube.get("topics", ns, "orders") is None, "Topic orders to be deleted")
        assert labelled(port, ns, topic="orders") == []
        assert labelled(port, ns, topic="orders.dlq") == []
        assert labelled(port, ns, consumer="audit") == []
        time.sleep(2.5)  # several GC (0.5 s) and refresh (1 s) intervals: nothing brings them back
        assert labelled(port, ns, topic="orders") == [] and labelled(port, ns, topic="orders.dlq") == []

        kube.create(topic(ns, "orders", deletionPolicy="Delete"))
        wait_for(
            lambda: set(STORAGE) <= names(labelled(port, ns, topic="orders")),
            "the re-created topic's storage series",
        )
    finally:
        running.stop()


def test_forgotten_topics_ignore_late_snapshots_until_revived() -> None:
    """A garbage collection or refresh that was running when its Topic's deletion began finishes
    after it: what it reports is dropped, until a Topic of that name is reconciled again."""
    from bucketq.core.gc import TopicStorage
    from bucketq.operator.metrics import QueueMetrics

    metrics = QueueMetrics()
    stored = TopicStorage(segments=2, bytes=10, held_for_lagging=1)
    metrics.set_storage("ns", "orders", stored)
    metrics.gc_deleted.labels("ns", "orders", "segments").inc(3)
    metrics.set_storage("ns", "orders.dlq", stored)
    metrics.forget_topic("ns", "orders", "orders.dlq")
    assert b'topic="orders' not in metrics.render()
    metrics.set_storage("ns", "orders", stored)  # the late one
    assert b'topic="orders"' not in metrics.render()
    metrics.revive("ns", "orders")
    metrics.set_storage("ns", "orders", stored)
    assert b'bucketq_topic_stored_segments{namespace="ns",topic="orders"} 2.0' in metrics.render()
