"""The custom resources Topic, Consumer and DeadLetterPolicy as pydantic models.

These models are the single source of truth: the operator parses specs with them and
:mod:`bucketq.operator.crds` generates the CRDs (structural OpenAPI v3 schemas) from them.
Field names are camelCase in Kubernetes (aliases) and snake_case in Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic.alias_generators import to_camel

from bucketq.core.keys import MAX_PARTITIONS
from bucketq.core.models import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_RETENTION_S

GROUP = "bucketq.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# A DNS-1123 subdomain of at most 63 characters: stricter than the engine's name rule, so every
# name the schema accepts is a valid topic or consumer name and a valid S3 prefix.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
NAME_MAX = 63

Name = Annotated[str, StringConstraints(min_length=1, max_length=NAME_MAX, pattern=NAME_PATTERN)]


def _cel(rule: str, message: str) -> dict[str, Any]:
    return {"x-kubernetes-validations": [{"rule": rule, "message": message}]}


class CrdModel(BaseModel):
    """Base of every spec and status model: camelCase aliases, unknown fields ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def to_k8s(self) -> dict[str, Any]:
        """The camelCase JSON form, without unset optional fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class DeletionPolicy(StrEnum):
    """What deleting the custom resource does to the data in the bucket."""

    RETAIN = "Retain"
    DELETE = "Delete"


class Phase(StrEnum):
    PENDING = "Pending"
    READY = "Ready"
    DEGRADED = "Degraded"
    FAILED = "Failed"
    DELETING = "Deleting"


# -- specs -----------------------------------------------------------------------------------------


class TopicSpec(CrdModel):
    """A topic: its partitions, retention and message size limit; the resource name is the topic name."""

    partitions: int = Field(
        1,
        ge=1,
        le=MAX_PARTITIONS,
        description="Number of partitions (per-key order holds within a partition). May only grow.",
        json_schema_extra=_cel("self >= oldSelf", "partitions may only grow"),
    )
    retention_seconds: int = Field(
        int(DEFAULT_RETENTION_S),
        ge=1,
        le=10 * 365 * 24 * 3600,
        description="Segments older than this and consumed by every consumer are deleted by garbage collection.",
    )
    max_message_bytes: int = Field(
        DEFAULT_MAX_MESSAGE_BYTES,
        ge=64,
        le=64 * 1024 * 1024,
        description="Largest accepted message (encoded), in bytes.",
    )
    max_retention_seconds: int | None = Field(
        None,
        ge=1,
        le=10 * 365 * 24 * 3600,
        description="No segment is kept longer, consumed or not (default: no limit). At least retentionSeconds.",
    )
    subscription_timeout_seconds: int | None = Field(
        None,
        ge=1,
        le=10 * 365 * 24 * 3600,
        description="A subscription with no running member and no activity for this long stops holding "
        "the topic's data; its readers later skip what was collected, counted (default: never).",
    )
    deletion_policy: DeletionPolicy = Field(
        DeletionPolicy.RETAIN,
        description="Retain keeps the topic's objects in the bucket when the Topic is deleted; Delete purges them.",
    )
    dead_letter_policy: Name | None = Field(
        None,
        description="Name of a DeadLetterPolicy in the same namespace (default: dead-letter after 5 deliveries).",
    )


class PushRetry(CrdModel):
    """Exponential backoff of redeliveries after a failed push (with jitter, applied by the sidecar).

    The n-th redelivery of a message waits about ``min(maxSeconds, initialSeconds * multiplier**(n-1))``.
    """

    model_config = ConfigDict(
        json_schema_extra=_cel(
            "self.maxSeconds >= self.initialSeconds", "maxSeconds must be at least initialSeconds"
        ),
    )

    initial_seconds: float = Field(
        1.0, ge=0.01, le=3600, description="Delay before the first redelivery of a failed push."
    )
    max_seconds: float = Field(60.0, ge=0.01, le=86_400, description="Longest delay between redeliveries.")
    multiplier: float = Field(2.0, ge=1.0, le=10.0, description="Growth of the delay per failed push.")

    @model_validator(mode="after")
    def _max_after_initial(self) -> PushRetry:
        # the same rule as the CEL validation, for specs that reach the operator without it
        if self.max_seconds < self.initial_seconds:
            raise ValueError("maxSeconds must be at least initialSeconds")
        return self


class PushDelivery(CrdModel):
    """Push delivery: the sidecar POSTs messages to the app."""

    model_config = ConfigDict(
        json_schema_extra=_cel(
            # has(): defaults are applied before CEL in the API server, not in offline checks
            "!has(self.format) || self.format != 'cloudevents-binary' || !has(self.batchSize) || self.batchSize == 1",
            "format cloudevents-binary carries one message per request: batchSize must be 1",
        ),
    )

    port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="The app's port (or the pod annotation bucketq.io/app-port).",
    )
    path: str = Field(
        "/bucketq",
        pattern=r"^/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*$",
        max_length=256,
        description="HTTP path the sidecar POSTs messages to.",
    )
    concurrency: int = Field(16, ge=1, le=10_000, description="Concurrent push requests per pod.")
    timeout_seconds: int = Field(
        600, ge=1, le=43_200, description="How long the app may take to answer a push."
    )
    batch_size: int = Field(
        1,
        ge=1,
        le=1000,
        description="Messages per push request (1: one message per request, the body is the message).",
    )
    retry: PushRetry = Field(
        default_factory=PushRetry,
        description="Backoff before a message whose push failed is pushed again.",
        json_schema_extra={"default": {}},
    )
    format: Literal["json", "cloudevents-structured", "cloudevents-binary"] = Field(
        "json",
        description="Body of a push: json (bucketq's envelope), cloudevents-structured "
        "(application/cloudevents+json) or cloudevents-binary (the payload as the body, ce-* headers).",
    )

    @model_validator(mode="after")
    def _binary_is_one_message(self) -> PushDelivery:
        # the same rule as the CEL validation, for specs that reach the operator without it
        if self.format == "cloudevents-binary" and self.batch_size != 1:
            raise ValueError("format cloudevents-binary carries one message per request: batchSize must be 1")
        return self


class Delivery(CrdModel):
    """How the sidecar hands messages to the app."""

    model_config = ConfigDict(
        json_schema_extra=_cel("self.mode == 'push' || !has(self.push)", "push settings need mode: push"),
    )

    mode: Literal["pull", "push"] = Field(
        "pull", description="pull: the app asks the sidecar; push: the sidecar POSTs."
    )
    push: PushDelivery | None = Field(None, description="Push settings (mode: push).")


class ConsumerSpec(CrdModel):
    """A consumer group: every pod naming it shares the work; each consumer gets every message."""

    topics: list[Name] = Field(
        ...,
        min_length=1,
        max_length=64,
        description="Topics this consumer subscribes to.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    start_position: Literal["earliest", "latest"] = Field(
        "earliest",
        description="Where a new subscription starts: the oldest stored message or the next one published.",
        json_schema_extra=_cel("self == oldSelf", "startPosition is immutable"),
    )
    visibility_timeout_seconds: int = Field(
        30,
        ge=1,
        le=43_200,
        description="How long a delivered message stays leased before it is redelivered.",
    )
    max_in_flight: int = Field(1000, ge=1, le=100_000, description="Leased messages per pod at most.")
    ordered: bool = Field(False, description="Deliver messages with the same key one at a time, in order.")
    profile: Literal["latency", "balanced", "economy"] = Field(
        "balanced",
        description="The sidecars' latency/cost trade-off: group-commit lingers, polling and heartbeat "
        "cadences (docs/tuning.md). A pod's bucketq.io/profile annotation overrides it.",
    )
    delivery: Delivery = Field(
        default_factory=Delivery,
        description="pull or push delivery to the app.",
        json_schema_extra={"default": {}},
    )
    dead_letter_policy: Name | None = Field(
        None,
        description="Deprecated and ignored (removed in the next API version): dead-letter settings belong "
        "to each Topic (its spec.deadLetterPolicy) and apply to all of its consumers.",
    )
    deletion_policy: DeletionPolicy = Field(
        DeletionPolicy.RETAIN,
        description="Retain keeps the subscription cursors when the Consumer is deleted; Delete removes them.",
    )


class DeadLetterPolicySpec(CrdModel):
    """When a message is given up on, and where it goes."""

    model_config = ConfigDict(
        json_schema_extra=_cel(
            "self.dropAction == 'DeadLetter' || !has(self.deadLetterTopic)",
            "deadLetterTopic needs dropAction: DeadLetter",
        ),
    )

    max_deliveries: int = Field(
        5,
        ge=1,
        le=1000,
        description="Deliveries after which a message is dead-lettered instead of redelivered.",
    )
    dead_letter_topic: Name | None = Field(
        None,
        description="Topic receiving dead letters (created if missing); default: '{topic}.dlq'.",
    )
    drop_action: Literal["DeadLetter", "Discard"] = Field(
        "DeadLetter",
        description="What a DROP (push) or a nack without requeue does: move the message to the dead-letter "
        "topic, or discard it (then no dead-letter topic is kept and maxDeliveries is not enforced).",
    )


# -- status ----------------------------------------------------------------------------------------


class Condition(CrdModel):
    """A Kubernetes-style condition (Ready, StorageReachable, ...)."""

    type: str = Field(..., max_length=64, description="Condition type.")
    status: Literal["True", "False", "Unknown"] = Field(..., description="True, False or Unknown.")
    reason: str | None = Field(None, max_length=128, description="CamelCase reason of the last transition.")
    message: str | None = Field(None, max_length=4096, description="Human-readable details.")
    last_transition_time: str | None = Field(
        None,
        json_schema_extra={"format": "date-time"},
        description="When the status last changed.",
    )
    observed_generation: int | None = Field(None, ge=0, description="Generation the condition was set for.")


Conditions = Annotated[
    list[Condition],
    Field(json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}),
]


class StatusBase(CrdModel):
    phase: Phase | None = Field(None, description="Pending, Ready, Degraded, Failed or Deleting.")
    observed_generation: int | None = Field(None, ge=0, description="Generation of the last reconciled spec.")
    conditions: Conditions | None = Field(None, description="Ready, StorageReachable and more.")


class TopicStatus(StatusBase):
    partitions: int | None = Field(None, ge=0, description="Partitions in the bucket.")
    messages: int | None = Field(None, ge=0, description="Messages ever published.")
    backlog: int | None = Field(None, ge=0, description="Largest backlog over the topic's consumers.")
    in_flight: int | None = Field(None, ge=0, description="Leased messages over all consumers.")
    dead_letter_topic: str | None = Field(None, description="Where dead letters go (none when discarded).")
    consumers: list[str] | None = Field(None, description="Consumers with a subscription on the topic.")
    last_garbage_collection: str | None = Field(
        None,
        json_schema_extra={"format": "date-time"},
        description="When garbage collection last ran.",
    )
    garbage_collected_objects: int | None = Field(
        None, ge=0, description="Objects deleted by the last collection."
    )


class ScalingTopic(CrdModel):
    topic: str = Field(description="One of the consumer's topics.")
    pending: int = Field(ge=0, description="Messages not yet done: backlog plus in flight.")
    backlog: int = Field(ge=0, description="Messages visible or delayed, not leased.")
    in_flight: int = Field(ge=0, description="Messages leased right now.")
    lease_holders: list[str] = Field(default_factory=list, description="Members holding a live lease.")


class ScalingStatus(CrdModel):
    """The figures the scaling endpoint answers from, kept so that it can answer them right after an
    operator restart (before its first refresh) and from a standby replica."""

    refreshed_at: float = Field(ge=0, description="When the figures were computed (Unix seconds).")
    topics: list[ScalingTopic] = Field(default_factory=list, description="Per topic of the consumer.")


class ConsumerStatus(StatusBase):
    consumer_id: str | None = Field(None, description="Stable id of the consumer in the bucket's registry.")
    backlog: int | None = Field(None, ge=0, description="Messages waiting, summed over topics.")
    in_flight: int | None = Field(None, ge=0, description="Leased messages, summed over topics.")
    dead_lettered: int | None = Field(None, ge=0, description="Messages dead-lettered, summed over topics.")
    oldest_age_seconds: float | None = Field(None, ge=0, description="Age of the oldest unfinished message.")
    scaling: ScalingStatus | None = Field(
        None, description="The last figures of the scaling endpoint (docs/operator.md, 'Scaling')."
    )


class DeadLetterPolicyStatus(StatusBase):
    applied_to: list[str] | None = Field(None, description="Topics this policy is applied to.")


# -- kinds -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    type: str
    json_path: str
    description: str = ""
    priority: int = 0


@dataclass(frozen=True)
class Kind:
    """A custom resource kind: names, models and how kubectl prints it."""

    kind: str
    plural: str
    short_names: tuple[str, ...]
    spec: type[CrdModel]
    status: type[CrdModel]
    columns: tuple[PrinterColumn, ...] = field(default=())

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"


_AGE = PrinterColumn("Age", "date", ".metadata.creationTimestamp")
# The Ready condition's status (True/False/Unknown), as most operators show it; Phase says which way.
_READY = PrinterColumn(
    "Ready", "string", '.status.conditions[?(@.type=="Ready")].status', "The Ready condition."
)
_PHASE = PrinterColumn("Phase", "string", ".status.phase", "Pending, Ready, Degraded, Failed or Deleting.")

TOPIC = Kind(
    "Topic",
    "topics",
    ("bqt",),
    TopicSpec,
    TopicStatus,
    (
        PrinterColumn("Partitions", "integer", ".spec.partitions", "Partitions of the topic."),
        PrinterColumn("Backlog", "integer", ".status.backlog", "Largest backlog over the topic's consumers."),
        _READY,
        _PHASE,
        PrinterColumn("Messages", "integer", ".status.messages", "Messages ever published.", priority=1),
        PrinterColumn("Deletion", "string", ".spec.deletionPolicy", "Retain or Delete.", priority=1),
        _AGE,
    ),
)
CONSUMER = Kind(
    "Consumer",
    "consumers",
    ("bqc",),
    ConsumerSpec,
    ConsumerStatus,
    (
        PrinterColumn("Topics", "string", ".spec.topics", "Subscribed topics."),
        PrinterColumn("Delivery", "string", ".spec.delivery.mode", "pull or push."),
        PrinterColumn("Backlog", "integer", ".status.backlog", "Messages waiting."),
        PrinterColumn("In-Flight", "integer", ".status.inFlight", "Leased messages."),
        _READY,
        _PHASE,
        PrinterColumn("Consumer-ID", "string", ".status.consumerId", "Registry id.", priority=1),
        _AGE,
    ),
)
DEAD_LETTER_POLICY = Kind(
    "DeadLetterPolicy",
    "deadletterpolicies",
    ("bqdlp",),
    DeadLetterPolicySpec,
    DeadLetterPolicyStatus,
    (
        PrinterColumn(
            "Max-Deliveries", "integer", ".spec.maxDeliveries", "Deliveries before dead-lettering."
        ),
        PrinterColumn("Drop", "string", ".spec.dropAction", "DeadLetter or Discard."),
        _READY,
        _PHASE,
        _AGE,
    ),
)
KINDS: tuple[Kind, ...] = (TOPIC, CONSUMER, DEAD_LETTER_POLICY)
