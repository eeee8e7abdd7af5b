"""Every error bucketq raises, in one tree. Every message names the problem in plain words.

Catch :class:`BucketqError` for everything, a family base for one kind of failure, or one condition::

    BucketqError
    ├── ConfigError            the configuration is malformed or incomplete
    ├── StorageError           the object store failed or cannot be reached
    │   ├── StorageTimeout       (also TimeoutError) no answer in time; the write's outcome is unknown
    │   ├── NotSupported         the store rejects a feature bucketq needs
    │   └── PreconditionFailed   a conditional write lost
    │       ├── AlreadyExists      put-if-absent found the key written
    │       └── Contended          another writer holds a live claim on the key
    ├── TopicNotFound          the topic does not exist
    │   └── TopicDeleted         ... and it went away while a write was under way
    ├── InvalidArgument        (also ValueError) an argument is bad: nothing was done
    │   ├── InvalidName          a topic or consumer name breaks the rules
    │   ├── InvalidMessage       a message cannot be encoded
    │   ├── MessageTooLarge      a message is over the topic's size limit
    │   └── InvalidReceipt       a receipt is not one bucketq delivered
    ├── LeaseLost              the lease is stale; the message may be redelivered elsewhere
    ├── PublishTimeout         a publish could not be made durable in time
    ├── Closed                 the producer or consumer is closed or draining
    └── SidecarError           the sidecar answered an error (raised by :mod:`bucketq.client`)
        ├── BadRequest           (also InvalidArgument) 400/415
        ├── Unauthorized         401
        ├── TopicNotFound        (also bucketq.TopicNotFound) 404
        ├── LeaseLost            (also bucketq.LeaseLost) 409
        ├── TooLarge             (also InvalidArgument) 413
        ├── Busy                 429, with ``retry_after``
        ├── Unavailable          503, with ``retry_after``
        └── ConnectionFailed     no answer at all

"(also X)" names a second base class. The sidecar client's errors are the engine's where the
condition is the same, so one ``except`` serves an app in either mode: ``except bucketq.LeaseLost``
catches the engine's lease loss and the sidecar's 409 alike, ``except bucketq.TopicNotFound`` both
kinds of unknown topic, and ``except bucketq.InvalidArgument`` (or ``ValueError``) every bad
argument, whether the engine or the sidecar found it. tests/test_public_api.py checks this drawing
against the classes.

Naming: a base class that stands for a family of failures, to be caught as a whole, ends in
``Error`` (``BucketqError``, ``ConfigError``, ``StorageError``, ``SidecarError``); a class for one
condition is named for what happened, without a suffix (``LeaseLost``, ``TopicNotFound``, ``Closed``),
so that ``except LeaseLost:`` reads as the case it handles. ``InvalidArgument`` is both: the family
of bad arguments, and what a bad argument with no class of its own (a negative limit, two
options that exclude each other) raises.

Everything here is exported from :mod:`bucketq`; the :class:`SidecarError` subclasses live in
:mod:`bucketq.client.errors` (exported from :mod:`bucketq.client`), next to the HTTP answers they
mirror. This module imports nothing but the standard library: the sidecar client depends on it
without the engine.
"""

from __future__ import annotations

__all__ = [
    "AlreadyExists",
    "BucketqError",
    "Closed",
    "ConfigError",
    "Contended",
    "InvalidArgument",
    "InvalidMessage",
    "InvalidName",
    "InvalidReceipt",
    "LeaseLost",
    "MessageTooLarge",
    "NotSupported",
    "PreconditionFailed",
    "PublishTimeout",
    "SidecarError",
    "StorageError",
    "StorageTimeout",
    "TopicDeleted",
    "TopicNotFound",
]


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


class InvalidArgument(BucketqError, ValueError):
    """An argument is bad (a value out of range, options that exclude each other): nothing was done.

    The base of every bad-argument error, and a ``ValueError``.
    """


class InvalidName(InvalidArgument):
    """A topic or consumer name breaks the naming rules."""


class MessageTooLarge(InvalidArgument):
    """A message exceeds the topic's max message bytes."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"message is {size} bytes, over the topic's max_message_bytes limit of {limit} bytes"
        )
        self.size = size
        self.limit = limit


class InvalidMessage(InvalidArgument):
    """A message cannot be encoded (payload not JSON-serialisable, bad header, ...)."""


class LeaseLost(BucketqError):
    """The lease token is stale: the message may already be redelivered elsewhere."""

    def __init__(self, position: object, reason: str = "lease token is no longer current") -> None:
        super().__init__(f"lease lost on message at {position}: {reason}")
        self.position = position
        self.reason = reason


class PublishTimeout(BucketqError):
    """The publish could not be made durable in time; it was not acknowledged."""


class InvalidReceipt(InvalidArgument):
    """A receipt is malformed: not one bucketq delivered, or altered on the way."""

    def __init__(self, text: object) -> None:
        super().__init__(f"malformed receipt {text!r}: pass the receipt exactly as it was delivered")


class Closed(BucketqError):
    """The producer or consumer is closed or draining."""


class SidecarError(BucketqError):
    """The sidecar answered an error: ``status`` (HTTP), ``code`` (stable) and ``message``.

    Raised by :mod:`bucketq.client`; its subclasses (one per kind of answer) are in
    :mod:`bucketq.client.errors`. ``retry_after`` is the seconds the sidecar asked to wait, if any.
    """

    def __init__(self, status: int, code: str, message: str, *, retry_after: float | None = None) -> None:
        # BucketqError's, not the next class in the MRO: a subclass that is also an engine error
        # (the client's LeaseLost is a bucketq.LeaseLost) sets that class's fields itself
        BucketqError.__init__(self, f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after
