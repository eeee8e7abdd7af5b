"""Errors raised by the sidecar clients, one :class:`~bucketq.errors.SidecarError` subclass per kind
of answer (the tree and the naming rule are drawn in :mod:`bucketq.errors`).

Where the engine has a class for the same condition, the client's error is that class too:
``except bucketq.LeaseLost`` catches :class:`LeaseLost` here, ``except bucketq.TopicNotFound``
:class:`TopicNotFound`, and ``except bucketq.InvalidArgument`` (a ``ValueError``)
:class:`BadRequest` and :class:`TooLarge`, so an app's error handling reads the same in library
and in sidecar mode.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from bucketq import errors
from bucketq.client.retry import parse_retry_after
from bucketq.errors import SidecarError

# How the sidecar's 404 message names the topic: the engine's TopicNotFound and TopicDeleted
# messages ("unknown topic 'orders': ...", "topic 'orders' is gone: ...").
_TOPIC_IN_MESSAGE = re.compile(r"topic '([^']*)'")


class BadRequest(SidecarError, errors.InvalidArgument):
    """400/415: the request is malformed or invalid; it changed nothing."""


class Unauthorized(SidecarError):
    """401: missing or wrong bearer token."""


class TopicNotFound(SidecarError, errors.TopicNotFound):
    """404: the topic does not exist; also a :class:`bucketq.TopicNotFound`.

    ``topic`` is the topic the sidecar's answer names (``None`` if it names none).
    """

    topic: str | None  # type: ignore[assignment]  # the engine's is always known; an answer may not say

    def __init__(self, status: int, code: str, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(status, code, message, retry_after=retry_after)
        found = _TOPIC_IN_MESSAGE.search(message)
        self.topic = found.group(1) if found else None


class LeaseLost(SidecarError, errors.LeaseLost):
    """409: the receipt is stale; the message may already be redelivered elsewhere; also a
    :class:`bucketq.LeaseLost`.

    ``reason`` is the sidecar's message; ``position`` is ``None`` (the receipt the app passed
    names the message).
    """

    def __init__(self, status: int, code: str, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(status, code, message, retry_after=retry_after)
        self.position = None
        self.reason = message


class TooLarge(SidecarError, errors.InvalidArgument):
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
