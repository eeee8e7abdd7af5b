"""Errors raised by bucketq. Every error names the problem in plain words."""

from __future__ import annotations


class BucketqError(Exception):
    """Base class of every bucketq error."""


class ConfigError(BucketqError):
    """The configuration is malformed or incomplete."""


class StorageError(BucketqError):
    """The object store failed (after retries) or could not be reached."""


class StorageTimeout(StorageError, TimeoutError):
    """The object store did not answer in time (the outcome of a write is unknown)."""


class NotSupported(StorageError):
    """The store rejects a feature bucketq asked for (e.g. conditional writes)."""


class PreconditionFailed(StorageError):
    """A conditional write lost: the key exists (412) or is being written by another writer."""


class AlreadyExists(PreconditionFailed):
    """Put-if-absent found the key already written."""


class Contended(PreconditionFailed):
    """Another writer holds a live claim on the key (csprng_verify): retry the same key later."""


class TopicNotFound(BucketqError):
    """The topic has no marker in the bucket."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"unknown topic {topic!r}: create it first (bucketq topic create {topic})")
        self.topic = topic


class TopicDeleted(TopicNotFound):
    """The topic was deleted (or deleted and created again) while a write was under way."""

    def __init__(self, topic: str, detail: str = "it was deleted") -> None:
        BucketqError.__init__(self, f"topic {topic!r} is gone: {detail}; nothing was acknowledged")
        self.topic = topic


class InvalidName(BucketqError, ValueError):
    """A topic or consumer name breaks the naming rules."""


class MessageTooLarge(BucketqError, ValueError):
    """A message exceeds the topic's max message bytes."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"message is {size} bytes, over the topic's max_message_bytes limit of {limit} bytes"
        )
        self.size = size
        self.limit = limit


class InvalidMessage(BucketqError, ValueError):
    """A message cannot be encoded (payload not JSON-serialisable, bad header, ...)."""


class LeaseLost(BucketqError):
    """The lease token is stale: the message may already be redelivered elsewhere."""

    def __init__(self, position: object, reason: str = "lease token is no longer current") -> None:
        super().__init__(f"lease lost on message at {position}: {reason}")
        self.position = position
        self.reason = reason


class PublishTimeout(BucketqError):
    """The publish could not be made durable in time; it was not acknowledged."""


class ClosedError(BucketqError):
    """The producer or consumer is closed or draining."""
