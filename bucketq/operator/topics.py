"""Topic reconciliation against the bucket (no Kubernetes here): config, dead-letter topic, figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bucketq.core.app import Bucketq
from bucketq.core.models import DeadLetterConfig, TopicConfig
from bucketq.core.stats import SubscriptionStats
from bucketq.core.topics import TopicInfo
from bucketq.errors import TopicNotFound
from bucketq.operator.models import DeadLetterPolicySpec, TopicSpec


def dead_letter_config(policy: DeadLetterPolicySpec | None) -> DeadLetterConfig:
    """The engine's dead-letter settings for a policy (None: the engine's defaults)."""
    if policy is None:
        return DeadLetterConfig()
    if policy.drop_action == "Discard":
        return DeadLetterConfig(enabled=False, max_deliveries=policy.max_deliveries)
    return DeadLetterConfig(
        enabled=True, max_deliveries=policy.max_deliveries, topic=policy.dead_letter_topic
    )


def topic_config(spec: TopicSpec, policy: DeadLetterPolicySpec | None) -> TopicConfig:
    return TopicConfig(
        partitions=spec.partitions,
        retention_seconds=float(spec.retention_seconds),
        max_message_bytes=spec.max_message_bytes,
        dead_letter=dead_letter_config(policy),
        max_retention_seconds=None
        if spec.max_retention_seconds is None
        else float(spec.max_retention_seconds),
        subscription_timeout_seconds=(
            None if spec.subscription_timeout_seconds is None else float(spec.subscription_timeout_seconds)
        ),
    )


def dead_letter_topic_config(source: TopicConfig) -> TopicConfig:
    """A dead-letter topic keeps what its source accepts, and has no dead-letter topic of its own."""
    return TopicConfig(
        retention_seconds=source.retention_seconds,
        max_message_bytes=source.max_message_bytes,
        dead_letter=DeadLetterConfig(enabled=False),
    )


async def apply_topic(bq: Bucketq, name: str, config: TopicConfig) -> TopicConfig:
    """Create or update the topic marker; make the dead-letter topic; start cursors on new partitions.

    Idempotent: nothing is written when the bucket already matches (reads first, so that no
    put-if-absent is even attempted). Raises BucketqError when the spec asks for fewer partitions
    than the topic has.
    """
    current = await current_config(bq, name)
    if current is None:
        current = (await bq.create_topic(name, config=config)).config
    grown = current.partitions < config.partitions
    if current != config:
        current = (await bq.update_topic(name, config)).config
    dlq = config.dead_letter_topic(name)
    if dlq is not None and dlq != name and await current_config(bq, dlq) is None:
        await bq.create_topic(dlq, config=dead_letter_topic_config(config))
    if grown:
        for consumer in await bq.catalog.consumers(name):
            await bq.init_subscription(name, consumer, "earliest")
    return current


async def delete_topic(bq: Bucketq, name: str, config: TopicConfig | None) -> int:
    """Purge the topic and its default dead-letter topic; returns objects deleted (0 if absent)."""
    deleted = 0
    names = [name]
    if config is not None and config.dead_letter.enabled and config.dead_letter.topic is None:
        names.append(f"{name}.dlq")
    for topic in names:
        try:
            deleted += await bq.delete_topic(topic, purge=True)
        except TopicNotFound:
            pass
    return deleted


async def current_config(bq: Bucketq, name: str) -> TopicConfig | None:
    try:
        return (await bq.catalog.marker(name, fresh=True)).config
    except TopicNotFound:
        return None


@dataclass(slots=True)
class TopicFigures:
    """What the status and the metrics show about a topic."""

    info: TopicInfo
    subscriptions: list[SubscriptionStats] = field(default_factory=list)

    @property
    def backlog(self) -> int:
        return max((s.backlog for s in self.subscriptions), default=0)

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in self.subscriptions)

    def status(self) -> dict[str, Any]:
        return {
            "partitions": self.info.config.partitions,
            "messages": self.info.messages,
            "backlog": self.backlog,
            "inFlight": self.in_flight,
            "consumers": list(self.info.consumers),
        }


async def topic_figures(bq: Bucketq, name: str) -> TopicFigures:
    """Describe the topic and compute every subscription's statistics."""
    info = await bq.describe_topic(name)
    subs = [s for c in info.consumers for s in await bq.stats(name, c)]
    return TopicFigures(info, subs)
