"""What a publish says besides its body: one value, shared by every way to publish.

A message is a body (a JSON ``payload`` or raw ``data`` bytes) and these options. The engine
(:meth:`bucketq.Producer.publish`, :meth:`bucketq.Bucketq.publish`), the sidecar's wire model
(:class:`bucketq.api_models.OutgoingMessage`), the sidecar clients (:mod:`bucketq.client`) and the
CLI all take the same :class:`PublishOptions`, so a field is added, documented and defaulted in
one place. The public publish methods still take each option as a keyword argument, as before
(typed field by field: ``**fields: Unpack[PublishFields]``); ``options=`` passes them as one value
instead (not both at once)::

    opts = PublishOptions(key="customer-7", headers={"source": "shop"}, delay=30)
    await producer.publish("orders", {"id": 1}, options=opts)
    client.publish("orders", {"id": 1}, options=opts)  # the same value through the sidecar

This module imports nothing but the standard library and :mod:`bucketq.errors`: the sidecar client
depends on it without the engine. The values are checked where a message is built (the engine's
``build_record``, the sidecar's request model), not here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict, Unpack

from bucketq.errors import InvalidArgument

__all__ = ["DEFAULT_OPTIONS", "PublishFields", "PublishOptions", "resolve_options"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishOptions:
    """The options of one publish (every field optional).

    * ``key`` — partition key: messages with one key go to one partition, in order.
    * ``headers`` — string name to string value, stored with the message.
    * ``dedup_id`` — idempotent publish: a repeat within the topic's dedup window is not stored
      again; the publish answers the first copy's position with ``duplicate`` set.
    * ``priority`` — lower is delivered first among a partition's visible messages (default 0).
    * ``delay`` — invisible for this many seconds after the publish; or
    * ``not_before`` — invisible until this unix time (give one of the two).
    * ``content_type`` — default ``application/json`` for a payload, ``application/octet-stream``
      for raw data.
    """

    key: str | None = None
    headers: Mapping[str, str] | None = None
    dedup_id: str | None = None
    priority: int = 0
    delay: float | None = None
    not_before: float | None = None
    content_type: str | None = None


DEFAULT_OPTIONS = PublishOptions()


class PublishFields(TypedDict, total=False):
    """The fields of :class:`PublishOptions` as keyword arguments of a publish method (PEP 692:
    type checkers and IDEs check and show each one). tests/test_public_api.py keeps the two equal."""

    key: str | None
    headers: Mapping[str, str] | None
    dedup_id: str | None
    priority: int
    delay: float | None
    not_before: float | None
    content_type: str | None


def resolve_options(options: PublishOptions | None, **fields: Unpack[PublishFields]) -> PublishOptions:
    """The options of a publish method's call: ``options`` if given, else its keyword arguments.

    Raises :class:`~bucketq.errors.InvalidArgument` when a call gives both (which one wins would be
    a guess) or ``options`` is not a :class:`PublishOptions`; ``TypeError`` for an unknown keyword.
    """
    if options is None:
        return PublishOptions(**fields)
    if not isinstance(options, PublishOptions):
        raise InvalidArgument(f"options must be a PublishOptions, got {type(options).__name__}")
    if fields:
        raise InvalidArgument(
            f"give the publish options either as options= or as keyword arguments, not both ({', '.join(fields)})"
        )
    return options
