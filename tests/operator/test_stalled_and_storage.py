"""The Consumer's ``Stalled`` condition and the topic storage gauges, from the figures the operator
computes (docs/operations.md, "Retention"); a Topic's retention limits reach the topic config."""

from __future__ import annotations

import time

from bucketq.core.gc import TopicStorage
from bucketq.core.stats import SubscriptionStats
from bucketq.operator.consumers import STALL_AFTER_S, ConsumerFigures
from bucketq.operator.metrics import QueueMetrics
from bucketq.operator.models import TopicSpec
from bucketq.operator.topics import topic_config


def _sub(topic: str, backlog: int, members: list[str], last_activity: float | None) -> SubscriptionStats:
    return SubscriptionStats(
        topic=topic,
        consumer="billing",
        messages=backlog,
        backlog=backlog,
        in_flight=0,
        delayed=0,
        acked=0,
        dead_lettered=0,
        redelivered=0,
        oldest_age_s=None,
        partitions=[],
        members=members,
        last_activity=last_activity,
    )


def test_stalled_when_work_waits_without_a_member_or_without_progress() -> None:
    now = time.time()
    busy = ConsumerFigures([_sub("orders", 10, ["m1"], now - 1), _sub("refunds", 0, [], None)])
    assert busy.stalled(now).ok is False  # refunds has nothing waiting: not stalled
    nobody = ConsumerFigures([_sub("orders", 10, [], now - 1)])
    cond = nobody.stalled(now)
    assert cond.ok is True and "orders: 10 waiting and no member running" in cond.message
    stuck = ConsumerFigures([_sub("orders", 3, ["m1"], now - STALL_AFTER_S - 1)])
    cond = stuck.stalled(now)
    assert cond.ok is True and "no progress" in cond.message and cond.type == "Stalled"


def test_storage_gauges_are_exported_per_topic() -> None:
    metrics = QueueMetrics()
    metrics.set_storage("team-a", "orders", TopicStorage(segments=12, bytes=34_567, held_for_lagging=5))
    text = metrics.render().decode()
    assert 'bucketq_topic_stored_bytes{namespace="team-a",topic="orders"} 34567.0' in text
    assert 'bucketq_topic_stored_segments{namespace="team-a",topic="orders"} 12.0' in text
    assert 'bucketq_topic_segments_held_for_lagging{namespace="team-a",topic="orders"} 5.0' in text


def test_topic_retention_limits_reach_the_topic_config() -> None:
    spec = TopicSpec.model_validate(
        {"retentionSeconds": 3600, "maxRetentionSeconds": 86400, "subscriptionTimeoutSeconds": 7200}
    )
    config = topic_config(spec, None)
    assert (config.max_retention_seconds, config.subscription_timeout_seconds) == (86400.0, 7200.0)
    unset = topic_config(TopicSpec(), None)
    assert unset.max_retention_seconds is None and unset.subscription_timeout_seconds is None
