"""Value objects of the protocol: topic configuration and the topic marker."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from bucketq.core.keys import MAX_PARTITIONS, validate_name

DEFAULT_RETENTION_S = 7 * 24 * 3600.0
DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024
_OPTIONAL_LIMITS = ("max_retention_seconds", "subscription_timeout_seconds")


class DeadLetterConfig(BaseModel):
    """When a message is dead-lettered, and where it goes."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    max_deliveries: int = Field(5, ge=1, le=1000)
    topic: str | None = None  # None: "{topic}.dlq"

    @field_validator("topic")
    @classmethod
    def _valid_topic(cls, value: str | None) -> str | None:
        return None if value is None else validate_name(value, "dead-letter topic")


class TopicConfig(BaseModel):
    """A topic's configuration, stored in its marker ``R/{topic}/.topic``."""

    model_config = ConfigDict(extra="forbid")

    partitions: int = Field(1, ge=1, le=MAX_PARTITIONS)
    retention_seconds: float = Field(DEFAULT_RETENTION_S, gt=0)
    max_message_bytes: int = Field(DEFAULT_MAX_MESSAGE_BYTES, ge=64, le=64 * 1024 * 1024)
    dead_letter: DeadLetterConfig = DeadLetterConfig()
    # Retention that cannot be held hostage (format 3; absent from markers when unset, so those
    # stay readable by format-2 processes). ``max_retention_seconds``: no segment is kept longer,
    # consumed or not. ``subscription_timeout_seconds``: a subscription with no live member and
    # no cursor write for this long no longer holds the topic's data (core/gc.py ``_abandoned``).
    max_retention_seconds: float | None = Field(None, gt=0)
    subscription_timeout_seconds: float | None = Field(None, gt=0)

    @model_serializer(mode="wrap")
    def _omit_unset_limits(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in _OPTIONAL_LIMITS:
            if data.get(name) is None:
                data.pop(name, None)
        return data

    @model_validator(mode="after")
    def _limits_agree(self) -> TopicConfig:
        if self.max_retention_seconds is not None and self.max_retention_seconds < self.retention_seconds:
            raise ValueError(
                f"max_retention_seconds ({self.max_retention_seconds:g}) must be at least "
                f"retention_seconds ({self.retention_seconds:g})"
            )
        return self

    def dead_letter_topic(self, topic: str) -> str | None:
        """The dead-letter topic's name, or None when dead-lettering is off."""
        if not self.dead_letter.enabled:
            return None
        return self.dead_letter.topic or f"{topic}.dlq"


class TopicMarker(BaseModel):
    """The JSON body of ``R/{topic}/.topic``."""

    model_config = ConfigDict(extra="ignore")

    v: int = 1
    name: str
    created_at: float
    updated_at: float
    config: TopicConfig
    # A random id per creation: writers bind their view of a partition's tail to it, so a topic
    # deleted and created again is never appended to with a view of the old one (format 2).
    # Format 1 markers have none ("").
    incarnation: str = ""
    # "deleting": the topic is fenced (no publish is acknowledged) while its objects are purged.
    state: Literal["live", "deleting"] = "live"
