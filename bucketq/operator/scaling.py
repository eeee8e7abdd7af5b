"""The scaling endpoint for KEDA's ``metrics-api`` scaler: ``GET /scaling/{namespace}/{consumer}``.

It answers JSON from the figures of the last status refresh (like ``/metrics``, it never calls S3)
with the consumer's ``pending`` messages (backlog + in flight, summed over its topics) and the
``replicas`` it needs::

    replicas = max(ceil(pending / messagesPerReplica), holders)

``holders`` are the distinct members owning a live lease. A ScaledObject with an ``AverageValue``
target of 1 on ``replicas`` makes KEDA's desired count ``ceil(replicas / 1) = replicas``, so a
scale-in never asks for fewer pods than hold leases, and scaling to zero happens only when nothing
is pending (nothing is leased then either). Below ``activation`` pending messages and with no
holder it answers 0 replicas: KEDA's activation threshold, applied here because KEDA's own applies
to the ``replicas`` value (docs/operator.md, "Scaling").

Query parameters: ``messagesPerReplica`` (integer >= 1, default 100), ``activation`` (integer >= 0,
default 0), ``topic`` (only this one of the consumer's topics). Errors answer
``{"error": code, "message": ...}``: 400 for a bad parameter, 404 for a consumer with no figures
(no Consumer resource in that namespace, or one never refreshed by any operator) and for a topic
the consumer has no figures for. KEDA reports such an answer as a failing trigger.

Right after an operator starts (a restart, a standby taking over, or a standby replica answering),
it has not refreshed anything yet: it answers from the last figures an operator wrote into the
Consumer's ``status.scaling`` (``"source": "status"``, ``ageSeconds`` from when they were computed),
until its own refresh replaces them (``"source": "refresh"``). So a restart never turns a scaler's
answer into an error or a zero.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

DEFAULT_MESSAGES_PER_REPLICA = 100
ROUTE = "/scaling/{namespace}/{consumer}"


class SubscriptionLoad(Protocol):
    """What scaling reads of one subscription (a :class:`SubscriptionStats`, or the persisted
    :class:`PersistedLoad`)."""

    @property
    def topic(self) -> str: ...
    @property
    def pending(self) -> int: ...
    @property
    def backlog(self) -> int: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def holders(self) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class PersistedLoad:
    """One topic's figures as an operator wrote them into a Consumer's ``status.scaling``."""

    topic: str
    pending: int
    backlog: int
    in_flight: int
    holders: list[str]


def persisted_loads(scaling: Mapping[str, Any] | None) -> tuple[list[PersistedLoad], float] | None:
    """The loads and their refresh time from a Consumer's ``status.scaling`` (None if absent or
    not readable: a status written by another version, or by hand)."""
    if not isinstance(scaling, Mapping):
        return None
    try:
        at = float(scaling["refreshedAt"])
        loads = [
            PersistedLoad(
                topic=str(t["topic"]),
                pending=int(t["pending"]),
                backlog=int(t["backlog"]),
                in_flight=int(t["inFlight"]),
                holders=[str(h) for h in t.get("leaseHolders") or ()],
            )
            for t in scaling.get("topics") or ()
        ]
    except (KeyError, TypeError, ValueError):
        return None
    return loads, at


class Snapshots(Protocol):
    """Where the figures come from (:class:`bucketq.operator.metrics.QueueMetrics`)."""

    def consumer_figures(
        self, namespace: str, consumer: str
    ) -> tuple[list[tuple[SubscriptionLoad, float]], str]:
        """Every subscription of ``consumer`` in ``namespace`` with the Unix time of its figures,
        and where they come from: ``refresh`` (this operator's) or ``status`` (persisted)."""
        ...


class BadRequest(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def desired_replicas(pending: int, holders: int, messages_per_replica: int, activation: int = 0) -> int:
    """The replicas a consumer needs: enough for its pending messages, never fewer than the members
    holding leases (removing one would strand its leases until they expire and redeliver them).

    0 only when no member holds a lease and at most ``activation`` messages are pending.
    """
    if messages_per_replica < 1:
        raise ValueError("messages_per_replica must be at least 1")
    if holders == 0 and pending <= activation:
        return 0
    return max(math.ceil(pending / messages_per_replica), holders)


@dataclass(frozen=True, slots=True)
class ScalingFigures:
    """What the endpoint answers for one consumer."""

    namespace: str
    consumer: str
    subscriptions: list[SubscriptionLoad]
    refreshed_at: float  # of the oldest figures used
    messages_per_replica: int
    activation: int
    source: str = "refresh"

    @property
    def pending(self) -> int:
        return sum(s.pending for s in self.subscriptions)

    @property
    def holders(self) -> list[str]:
        return sorted({m for s in self.subscriptions for m in s.holders})

    @property
    def replicas(self) -> int:
        return desired_replicas(self.pending, len(self.holders), self.messages_per_replica, self.activation)

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        return {
            "namespace": self.namespace,
            "consumer": self.consumer,
            "replicas": self.replicas,
            "pending": self.pending,
            "backlog": sum(s.backlog for s in self.subscriptions),
            "inFlight": sum(s.in_flight for s in self.subscriptions),
            "holders": len(self.holders),
            "leaseHolders": self.holders,
            "messagesPerReplica": self.messages_per_replica,
            "activation": self.activation,
            "topics": {
                s.topic: {
                    "pending": s.pending,
                    "backlog": s.backlog,
                    "inFlight": s.in_flight,
                    "leaseHolders": list(s.holders),
                }
                for s in sorted(self.subscriptions, key=lambda s: s.topic)
            },
            "refreshedAt": self.refreshed_at,
            "source": self.source,
            "ageSeconds": round(max(0.0, now - self.refreshed_at), 3),
        }


def _int_param(query: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(400, "bad_parameter", f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise BadRequest(400, "bad_parameter", f"{name} must be at least {minimum}, got {value}")
    return value


def scaling_figures(
    source: Snapshots, namespace: str, consumer: str, query: Mapping[str, str]
) -> ScalingFigures:
    """The figures for one request; :class:`BadRequest` for bad parameters or an unknown consumer."""
    per_replica = _int_param(query, "messagesPerReplica", DEFAULT_MESSAGES_PER_REPLICA, 1)
    activation = _int_param(query, "activation", 0, 0)
    found, origin = source.consumer_figures(namespace, consumer)
    if not found:
        raise BadRequest(
            404,
            "consumer_not_found",
            f"no figures for consumer {consumer!r} in namespace {namespace!r}: it has no Consumer "
            "resource with a subscribed Topic there, or no operator has refreshed it yet",
        )
    topic = query.get("topic")
    if topic is not None:
        found = [(s, at) for s, at in found if s.topic == topic]
        if not found:
            raise BadRequest(
                404,
                "topic_not_found",
                f"consumer {consumer!r} in namespace {namespace!r} has no figures for topic {topic!r}",
            )
    return ScalingFigures(
        namespace=namespace,
        consumer=consumer,
        subscriptions=[s for s, _ in found],
        refreshed_at=min(at for _, at in found),
        messages_per_replica=per_replica,
        activation=activation,
        source=origin,
    )


def scaling_handler(source: Snapshots) -> Callable[[web.Request], Any]:
    """The aiohttp handler of :data:`ROUTE` over ``source``'s snapshots (no I/O)."""

    async def handle(request: web.Request) -> web.Response:
        try:
            figures = scaling_figures(
                source, request.match_info["namespace"], request.match_info["consumer"], request.query
            )
        except BadRequest as exc:
            return web.json_response({"error": exc.code, "message": exc.message}, status=exc.status)
        return web.json_response(figures.to_json())

    return handle
