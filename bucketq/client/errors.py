"""Errors raised by the sidecar clients, one :class:`~bucketq.errors.SidecarError` subclass per kind
of answer (the tree and the naming rule are drawn in :mod:`bucketq.errors`)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from bucketq.client.retry import parse_retry_after
from bucketq.errors import SidecarError


class BadRequest(SidecarError):
    """400/415: the request is malformed or invalid; it changed nothing."""


class Unauthorized(SidecarError):
    """401: missing or wrong bearer token."""


class TopicNotFound(SidecarError):
    """404: the topic does not exist (the engine, in library mode, raises :class:`bucketq.TopicNotFound`)."""


class LeaseLost(SidecarError):
    """409: the receipt is stale; the message may already be redelivered elsewhere.

    The engine, in library mode, raises :class:`bucketq.LeaseLost` for the same condition.
    """


class TooLarge(SidecarError):
    """413: a message, batch or body is over its limit; nothing was published."""


class Busy(SidecarError):
    """429: the publish buffer is full; retry after ``retry_after`` seconds."""


class Unavailable(SidecarError):
    """503: starting, draining, or the bucket is unreachable; retry after ``retry_after`` seconds."""


class ConnectionFailed(SidecarError):
    """The sidecar could not be reached at all (status 0)."""


_BY_STATUS: dict[int, type[SidecarError]] = {
    400: BadRequest,
    401: Unauthorized,
    404: TopicNotFound,
    409: LeaseLost,
    413: TooLarge,
    415: BadRequest,
    429: Busy,
    503: Unavailable,
}


def error_for(status: int, body: bytes, headers: Mapping[str, str]) -> SidecarError:
    """The exception for an error answer."""
    code, message = "http_error", body.decode(errors="replace")[:500] or f"HTTP {status}"
    try:
        data = json.loads(body)
        if isinstance(data, dict):
            code = str(data.get("error", code))
            message = str(data.get("message", message))
    except ValueError:
        pass
    retry_after = parse_retry_after(headers.get("Retry-After"))
    if status == 404 and code != "topic_not_found":
        return SidecarError(status, code, message)
    return _BY_STATUS.get(status, SidecarError)(status, code, message, retry_after=retry_after)


__all__ = [
    "BadRequest",
    "Busy",
    "ConnectionFailed",
    "LeaseLost",
    "SidecarError",
    "TooLarge",
    "TopicNotFound",
    "Unauthorized",
    "Unavailable",
    "error_for",
]
