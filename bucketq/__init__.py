"""bucketq: a message queue whose only durable store is an S3-compatible bucket.

Library mode::

    async with Bucketq.from_env() as bq:
        await bq.create_topic("orders", partitions=4)
        producer = await bq.register_producer("shop")
        await producer.publish("orders", {"id": 1})
        consumer = await bq.register_consumer("billing", topics=["orders"])
        for msg in await consumer.poll(max_messages=10, wait=5):
            await msg.ack()

Every error a caller can catch is exported here (the tree is drawn in :mod:`bucketq.errors`), and so
is :class:`PublishOptions`, the options of a publish in every mode (:mod:`bucketq.publish_options`). The
engine's classes load on first use: ``import bucketq.client`` (an app talking to the sidecar) then
costs pydantic and aiohttp, not the engine, its settings and its YAML and UUID libraries.
"""

from __future__ import annotations

# Modules, not names: a package's public names are its exports (tests/test_public_api.py).
import importlib
import typing

from bucketq.errors import (
    AlreadyExists,
    BucketqError,
    Closed,
    ConfigError,
    Contended,
    InvalidArgument,
    InvalidMessage,
    InvalidName,
    InvalidReceipt,
    LeaseLost,
    MessageTooLarge,
    NotSupported,
    PreconditionFailed,
    PublishTimeout,
    SidecarError,
    StorageError,
    StorageTimeout,
    TopicDeleted,
    TopicNotFound,
)
from bucketq.publish_options import PublishOptions

if typing.TYPE_CHECKING:
    # What type checkers and IDEs see; at run time _LAZY below resolves the same names on first use.
    from bucketq.config import ConsumerSettings, ProducerSettings, Settings
    from bucketq.core.app import Bucketq, BucketqBuilder
    from bucketq.core.consumer import Consumer
    from bucketq.core.message import Message
    from bucketq.core.models import DeadLetterConfig, TopicConfig
    from bucketq.core.producer import Producer, PublishResult
    from bucketq.core.stats import SubscriptionStats
    from bucketq.core.topics import TopicInfo

__version__ = "0.1.0"

# Engine names -> the module defining each (tests/test_public_api.py checks that this table, the
# TYPE_CHECKING imports above and __all__ agree).
_LAZY: dict[str, str] = {
    "Bucketq": "bucketq.core.app",
    "BucketqBuilder": "bucketq.core.app",
    "Consumer": "bucketq.core.consumer",
    "ConsumerSettings": "bucketq.config",
    "DeadLetterConfig": "bucketq.core.models",
    "Message": "bucketq.core.message",
    "Producer": "bucketq.core.producer",
    "ProducerSettings": "bucketq.config",
    "PublishResult": "bucketq.core.producer",
    "Settings": "bucketq.config",
    "SubscriptionStats": "bucketq.core.stats",
    "TopicConfig": "bucketq.core.models",
    "TopicInfo": "bucketq.core.topics",
}


def __getattr__(name: str) -> typing.Any:
    """Import an engine name from its module on first access, then keep it as a module attribute."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bucketq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AlreadyExists",
    "Bucketq",
    "BucketqBuilder",
    "BucketqError",
    "Closed",
    "ConfigError",
    "Consumer",
    "ConsumerSettings",
    "Contended",
    "DeadLetterConfig",
    "InvalidArgument",
    "InvalidMessage",
    "InvalidName",
    "InvalidReceipt",
    "LeaseLost",
    "Message",
    "MessageTooLarge",
    "NotSupported",
    "PreconditionFailed",
    "Producer",
    "ProducerSettings",
    "PublishOptions",
    "PublishResult",
    "PublishTimeout",
    "Settings",
    "SidecarError",
    "StorageError",
    "StorageTimeout",
    "SubscriptionStats",
    "TopicConfig",
    "TopicDeleted",
    "TopicInfo",
    "TopicNotFound",
    "__version__",
]
