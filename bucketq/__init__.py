"""bucketq: a message queue whose only durable store is an S3-compatible bucket.

Library mode::

    async with Bucketq.from_env() as bq:
        await bq.create_topic("orders", partitions=4)
        producer = await bq.register_producer("shop")
        await producer.publish("orders", {"id": 1})
        consumer = await bq.register_consumer("billing", topics=["orders"])
        for msg in await consumer.poll(max_messages=10, wait=5):
            await msg.ack()
"""

from bucketq.config import ConsumerSettings, ProducerSettings, Settings
from bucketq.core.app import Bucketq, BucketqBuilder
from bucketq.core.consumer import Consumer
from bucketq.core.message import Message
from bucketq.core.models import DeadLetterConfig, TopicConfig
from bucketq.core.producer import Producer, PublishResult
from bucketq.core.stats import SubscriptionStats
from bucketq.core.topics import TopicInfo
from bucketq.errors import (
    BucketqError,
    ConfigError,
    InvalidMessage,
    InvalidName,
    LeaseLost,
    MessageTooLarge,
    PublishTimeout,
    StorageError,
    TopicDeleted,
    TopicNotFound,
)

__version__ = "0.1.0"

__all__ = [
    "Bucketq",
    "BucketqBuilder",
    "BucketqError",
    "ConfigError",
    "Consumer",
    "ConsumerSettings",
    "DeadLetterConfig",
    "InvalidMessage",
    "InvalidName",
    "LeaseLost",
    "Message",
    "MessageTooLarge",
    "Producer",
    "ProducerSettings",
    "PublishResult",
    "PublishTimeout",
    "Settings",
    "StorageError",
    "SubscriptionStats",
    "TopicConfig",
    "TopicDeleted",
    "TopicInfo",
    "TopicNotFound",
    "__version__",
]
