"""HTTP errors of the localhost API and the mapping from engine errors to status codes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from bucketq.errors import (
    BucketqError,
    Closed,
    InvalidArgument,
    InvalidMessage,
    InvalidName,
    InvalidReceipt,
    LeaseLost,
    MessageTooLarge,
    PublishTimeout,
    StorageError,
    TopicNotFound,
)

RETRY_AFTER_S = 1


class ApiError(Exception):
    """An error answer: HTTP ``status``, a stable ``code`` and a sentence naming the problem."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        details: list[dict[str, Any]] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.details is not None:
            out["details"] = self.details
        return out

    def response(self) -> web.Response:
        return web.Response(
            status=self.status,
            text=json.dumps(self.body()),
            content_type="application/json",
            headers=self.headers,
        )


def unavailable(code: str, message: str) -> ApiError:
    """503 with Retry-After: the caller should try again shortly."""
    return ApiError(503, code, message, headers={"Retry-After": str(RETRY_AFTER_S)})


def invalid_body(exc: ValidationError, what: str) -> ApiError:
    """400 naming every field that is missing or wrong."""
    details = [
        {"field": ".".join(str(p) for p in err["loc"]) or "(body)", "problem": err["msg"]}
        for err in exc.errors(include_url=False, include_context=False, include_input=False)
    ]
    summary = "; ".join(f"{d['field']}: {d['problem']}" for d in details[:5])
    return ApiError(400, "invalid_request", f"invalid {what}: {summary}", details=details)


def from_exception(exc: BaseException) -> ApiError:
    """The API error for an engine exception (unknown exceptions become 500)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, LeaseLost):
        return ApiError(
            409,
            "lease_lost",
            f"{exc}; the lease expired or the message was settled, and it may be redelivered elsewhere",
        )
    if isinstance(exc, InvalidReceipt):
        return ApiError(400, "invalid_receipt", str(exc))
    if isinstance(exc, TopicNotFound):
        return ApiError(404, "topic_not_found", str(exc))
    if isinstance(exc, MessageTooLarge):
        return ApiError(413, "message_too_large", str(exc))
    if isinstance(exc, InvalidName):
        return ApiError(400, "invalid_name", str(exc))
    if isinstance(exc, InvalidMessage):
        return ApiError(400, "invalid_message", str(exc))
    if isinstance(exc, InvalidArgument):
        return ApiError(400, "invalid_argument", str(exc))
    if isinstance(exc, PublishTimeout):
        return unavailable("publish_timeout", str(exc))
    if isinstance(exc, Closed):
        return unavailable("draining", f"the sidecar is shutting down: {exc}")
    if isinstance(exc, StorageError):
        return unavailable("storage_unavailable", f"the bucket is not reachable: {exc}")
    if isinstance(exc, TimeoutError):
        return unavailable("timeout", "the bucket did not answer in time; nothing was acknowledged")
    if isinstance(exc, BucketqError):
        return ApiError(500, "internal", str(exc))
    return ApiError(500, "internal", f"unexpected error: {type(exc).__name__}: {exc}")
