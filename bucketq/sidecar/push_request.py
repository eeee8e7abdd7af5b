"""The HTTP request of one push: the app's choice of format, the bucketq headers, the trace context.

Formats (``BUCKETQ_SIDECAR_PUSH_FORMAT``, per consumer):

* ``json`` (default): the pulled message's JSON without receipt (a ``PushBatch`` for batches);
* ``cloudevents-structured``: the message as a CloudEvent, ``application/cloudevents+json`` (a
  batch as ``application/cloudevents-batch+json``);
* ``cloudevents-binary``: the message's data as the body with its Content-Type, the attributes as
  ``ce-*`` headers (one message per request).

Every request also carries ``bucketq-topic`` and ``bucketq-consumer`` (and for one message
``bucketq-id`` and ``bucketq-deliveries``), and the trace context of the delivery.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from bucketq.api_models import PushBatch
from bucketq.core.message import Message
from bucketq.sidecar import cloud_events
from bucketq.sidecar.config import PushFormat
from bucketq.sidecar.delivery import to_wire


def push_request(
    messages: Sequence[Message], fmt: PushFormat, consumer: str, trace: Mapping[str, str], *, batched: bool
) -> tuple[dict[str, str], bytes]:
    """Headers and body of the push of ``messages`` (binary mode takes exactly one).

    ``batched``: the subscription pushes batches (``PUSH_BATCH_SIZE`` > 1). Its app then always
    gets the batch shape, even when a poll found one message: the shape never depends on timing."""
    if fmt == "cloudevents-binary":
        (only,) = messages
        headers, body = cloud_events.binary(cloud_events.to_event(only, receipt=False))
    elif fmt == "cloudevents-structured":
        events = [cloud_events.to_event(m, receipt=False) for m in messages]
        headers, body = cloud_events.batch(events) if batched else cloud_events.structured(events[0])
    else:
        wire = [to_wire(m, with_receipt=False) for m in messages]
        content = PushBatch(messages=wire) if batched else wire[0]
        headers = {"content-type": "application/json"}
        body = json.dumps(content.model_dump(mode="json", exclude_none=True)).encode()
    headers.update({"bucketq-topic": messages[0].topic, "bucketq-consumer": consumer})
    if len(messages) == 1:
        headers.update({"bucketq-id": messages[0].id, "bucketq-deliveries": str(messages[0].deliveries)})
    headers.update(trace)
    return headers, body
