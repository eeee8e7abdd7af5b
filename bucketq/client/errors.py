"""Errors raised by the sidecar clients, one class per kind of answer."""

from __future__ import annotations

import json
from collections.abc import Mapping


class SidecarError(Exception):
    """The sidecar answered an error: ``status`` (HTTP), ``code`` (stable) and ``message``."""

    def __init__(self, status: int, code: str, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after


class BadRequestError(SidecarError):
    """400/415: the request is malformed or invalid; it changed nothing."""


class UnauthorizedError(SidecarError):
    """401: missing or wrong bearer token."""


class TopicNotFoundError(SidecarError):
    """404: the topic does not exist."""


class LeaseLostError(SidecarError):
    """409: the receipt is stale; the message may already be redelivered elsewhere."""


class TooLargeError(SidecarError):
    """413: a message, batch or body is over its limit; nothing was published."""


class BusyError(SidecarError):
    """429: the publish buffer is full; retry after ``retry_after`` seconds."""


class UnavailableError(SidecarError):
    """503: starting, draining, or the bucket is unreachable; retry after ``retry_after`` seconds."""


class ConnectionFailedError(SidecarError):
    """The sidecar could not be reached at all (status 0)."""


_BY_STATUS: dict[int, type[SidecarError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    404: TopicNotFoundError,
    409: LeaseLostError,
    413: TooLargeError,
    415: BadRequestError,
    429: BusyError,
    503: UnavailableError,
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
    retry_after: float | None = None
    raw = headers.get("Retry-After")
    if raw is not None:
        try:
            retry_after = float(raw)
        except ValueError:
            retry_after = None
    if status == 404 and code != "topic_not_found":
        return SidecarError(status, code, message)
    return _BY_STATUS.get(status, SidecarError)(status, code, message, retry_after=retry_after)
