"""Python clients of the sidecar's localhost API, so that a Python app never speaks HTTP by hand.

Pull mode::

    from bucketq.client import Client

    with Client() as client:  # $BUCKETQ_SIDECAR_URL or http://127.0.0.1:3580
        client.publish("orders", {"id": 1}, key="customer-7")
        for msg in client.pull(max_messages=10, wait=5):
            handle(msg.payload)
            client.ack(msg.receipt)

:class:`AsyncClient` is the asyncio twin; :func:`serve` runs a push-mode handler.
"""

from bucketq.api_models import (
    DeliveredMessage,
    OutgoingMessage,
    PublishBatchResponse,
    PublishResponse,
    SettleBatchResponse,
    SettleResponse,
)
from bucketq.client._common import message
from bucketq.client.aio import AsyncClient
from bucketq.client.errors import (
    BadRequest,
    Busy,
    ConnectionFailed,
    LeaseLost,
    SidecarError,
    TooLarge,
    TopicNotFound,
    Unauthorized,
    Unavailable,
)
from bucketq.client.push import PushServer, serve, serve_async
from bucketq.client.retry import RetryPolicy
from bucketq.client.sync import Client

__all__ = [
    "AsyncClient",
    "BadRequest",
    "Busy",
    "Client",
    "ConnectionFailed",
    "DeliveredMessage",
    "LeaseLost",
    "OutgoingMessage",
    "PublishBatchResponse",
    "PublishResponse",
    "PushServer",
    "RetryPolicy",
    "SettleBatchResponse",
    "SettleResponse",
    "SidecarError",
    "TooLarge",
    "TopicNotFound",
    "Unauthorized",
    "Unavailable",
    "message",
    "serve",
    "serve_async",
]
