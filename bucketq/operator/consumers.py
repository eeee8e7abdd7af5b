"""Consumer reconciliation against the bucket (no Kubernetes here): registry, cursors, figures."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from bucketq.core.app import Bucketq
from bucketq.core.registry import Registration
from bucketq.core.stats import SubscriptionStats
from bucketq.errors import TopicNotFound
from bucketq.operator.models import ConsumerSpec, ScalingStatus, ScalingTopic
from bucketq.operator.status import STALLED, Cond


class MissingTopics(Exception):
    """Some of the consumer's topics do not exist in the bucket (yet)."""

    def __init__(self, topics: list[str]) -> None:
        super().__init__(f"waiting for topic(s) {', '.join(topics)}: create the Topic resource(s)")
        self.topics = topics


def registry_meta(spec: ConsumerSpec) -> dict[str, Any]:
    """What the registry records about a consumer (its id is derived from the name alone)."""
    return {
        "topics": list(spec.topics),
        "start_position": spec.start_position,
        "visibility_timeout_s": spec.visibility_timeout_seconds,
        "max_in_flight": spec.max_in_flight,
        "ordered": spec.ordered,
        "delivery": spec.delivery.mode,
    }


async def apply_consumer(bq: Bucketq, name: str, spec: ConsumerSpec) -> Registration:
    """Register the consumer and start its cursors on every partition of every topic (idempotent)."""
    missing = []
    for topic in spec.topics:
        try:
            await bq.catalog.marker(topic, fresh=True)
        except TopicNotFound:
            missing.append(topic)
    if missing:
        raise MissingTopics(missing)
    meta = registry_meta(spec)
    reg = await bq.registry.get("consumer", name)
    if reg is None or reg.meta != meta:
        reg = await bq.registry.register("consumer", name, **meta)
    for topic in spec.topics:
        await bq.init_subscription(topic, name, spec.start_position)
    return reg


async def unsubscribe(bq: Bucketq, name: str, topics: list[str]) -> int:
    """Delete the consumer's cursors on ``topics``; returns objects deleted."""
    deleted = 0
    for topic in topics:
        deleted += await bq.delete_subscription(topic, name)
    return deleted


async def delete_consumer(bq: Bucketq, name: str, topics: list[str]) -> int:
    """Remove the consumer's cursors on ``topics`` and its registration; returns objects deleted."""
    deleted = await unsubscribe(bq, name, topics)
    if await bq.registry.unregister("consumer", name):
        deleted += 1
    return deleted


# A subscription with waiting messages and no cursor write for this long is stalled even while
# members heartbeat (they may be stuck, paused or all failing).
STALL_AFTER_S = 300.0


@dataclass(frozen=True, slots=True)
class ConsumerFigures:
    subscriptions: list[SubscriptionStats]

    def stalled(self, now: float | None = None) -> Cond:
        """``Stalled``: True when a subscription has messages waiting and no member, or no cursor
        write for ``STALL_AFTER_S``; the message names each one and why."""
        now = time.time() if now is None else now
        why = []
        for s in self.subscriptions:
            if s.backlog <= 0:
                continue
            if not s.members:
                why.append(f"{s.topic}: {s.backlog} waiting and no member running")
            elif s.last_activity is None or now - s.last_activity > STALL_AFTER_S:
                why.append(f"{s.topic}: {s.backlog} waiting and no progress for over {STALL_AFTER_S:.0f}s")
        if why:
            return Cond(STALLED, True, "NoProgress", "; ".join(why))
        return Cond(
            STALLED, False, "Progressing", "every subscription with work has a member making progress"
        )

    def scaling(self, refreshed_at: float) -> dict[str, Any]:
        """``status.scaling``: what the scaling endpoint answers from (ScalingStatus)."""
        return ScalingStatus(
            refreshed_at=round(refreshed_at, 3),
            topics=[
                ScalingTopic(
                    topic=s.topic,
                    pending=s.pending,
                    backlog=s.backlog,
                    in_flight=s.in_flight,
                    lease_holders=list(s.holders),
                )
                for s in sorted(self.subscriptions, key=lambda s: s.topic)
            ],
        ).to_k8s()

    def status(self) -> dict[str, Any]:
        ages = [s.oldest_age_s for s in self.subscriptions if s.oldest_age_s is not None]
        out: dict[str, Any] = {
            "backlog": sum(s.backlog for s in self.subscriptions),
            "inFlight": sum(s.in_flight for s in self.subscriptions),
            "deadLettered": sum(s.dead_lettered for s in self.subscriptions),
            "oldestAgeSeconds": round(max(ages), 3) if ages else 0,
        }
        return out


async def consumer_figures(bq: Bucketq, name: str, topics: list[str]) -> ConsumerFigures:
    subs: list[SubscriptionStats] = []
    for topic in topics:
        try:
            subs += await bq.stats(topic, name)
        except TopicNotFound:
            continue
    return ConsumerFigures(subs)
