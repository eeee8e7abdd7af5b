"""The blocking client of the sidecar's localhost API (standard library ``http.client``, keep-alive)."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar, Unpack
from urllib.parse import urlsplit

from pydantic import BaseModel

from bucketq.api_models import (
    DeliveredMessage,
    ExtendRequest,
    NackRequest,
    OutgoingMessage,
    PublishBatchResponse,
    PublishResponse,
    PullResponse,
    SettleBatchResponse,
    SettleResponse,
)
from bucketq.client._common import (
    batch_body,
    default_url,
    extend_entries,
    message,
    nack_body,
    nack_entries,
    publish_path,
    wire,
)
from bucketq.client.errors import ConnectionFailed, SidecarError, error_for
from bucketq.client.retry import NO_RETRY, RetryPolicy
from bucketq.publish_options import PublishFields, PublishOptions

M = TypeVar("M", bound=BaseModel)


class Client:
    """Blocking twin of :class:`~bucketq.client.AsyncClient` (one connection; not thread-safe).

    Use one client per thread, as ``with Client() as client``. A 429 or 503 is first retried after
    the ``Retry-After`` it names, as ``retry`` says (:class:`~bucketq.client.RetryPolicy`; ``None``:
    never).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        retry: RetryPolicy | None = RetryPolicy(),
    ) -> None:
        self.url = (url or default_url()).rstrip("/")
        self.retry = retry or NO_RETRY
        parts = urlsplit(self.url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"sidecar URL must be http://host:port, got {self.url!r}")
        self._host, self._port = parts.hostname, parts.port or 80
        self.timeout = timeout
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._conn: http.client.HTTPConnection | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _call(
        self, method: str, path: str, body: Any = None, *, extra_timeout: float = 0.0, retry: bool = True
    ) -> bytes:
        """One request, tried again after a 429 or 503 as :attr:`retry` says (:mod:`bucketq.client.retry`)."""
        tries = (self.retry if retry else NO_RETRY).begin()
        while True:
            try:
                return self._call_once(method, path, body, extra_timeout=extra_timeout)
            except SidecarError as exc:
                wait = tries.wait_after(exc)
                if wait is None:
                    raise
            time.sleep(wait)

    def _call_once(self, method: str, path: str, body: Any, *, extra_timeout: float) -> bytes:
        payload = None if body is None else json.dumps(body).encode()
        for attempt in (1, 2):  # a kept-alive connection the server closed is retried once
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
            self._conn.timeout = self.timeout + extra_timeout
            if self._conn.sock is not None:
                self._conn.sock.settimeout(self._conn.timeout)
            try:
                self._conn.request(method, path, body=payload, headers=self._headers)
                resp = self._conn.getresponse()
                data = resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self.close()
                if attempt == 2:
                    raise ConnectionFailed(
                        0, "connection_failed", f"{method} {self.url}{path}: {exc}"
                    ) from exc
                continue
            except OSError as exc:
                self.close()
                raise ConnectionFailed(0, "connection_failed", f"{method} {self.url}{path}: {exc}") from exc
            if resp.status >= 400:
                raise error_for(resp.status, data, dict(resp.getheaders()))
            return data
        raise AssertionError("unreachable")

    def _model(
        self, model: type[M], method: str, path: str, body: Any = None, *, extra_timeout: float = 0.0
    ) -> M:
        return model.model_validate_json(self._call(method, path, body, extra_timeout=extra_timeout))

    # -- publish ---------------------------------------------------------------------------------

    def publish(
        self,
        topic: str,
        payload: Any = None,
        *,
        data: bytes | None = None,
        options: PublishOptions | None = None,
        **fields: Unpack[PublishFields],
    ) -> PublishResponse:
        """Publish one message; returns once it is durable in the bucket.

        A JSON ``payload`` or raw ``data`` bytes, and the options of :class:`~bucketq.PublishOptions`
        as keyword arguments or as one ``options`` value (not both).
        """
        m = message(payload, data=data, options=options, **fields)
        return self._model(PublishResponse, "POST", publish_path(topic), wire(m))

    def publish_batch(
        self, topic: str, messages: Iterable[OutgoingMessage | Mapping[str, Any]]
    ) -> PublishBatchResponse:
        """Publish many messages; check ``failed`` and each result's ``status``."""
        return self._model(
            PublishBatchResponse, "POST", publish_path(topic, batch=True), batch_body(messages)
        )

    # -- consume ---------------------------------------------------------------------------------

    def pull(self, max_messages: int = 10, wait: float = 0.0) -> list[DeliveredMessage]:
        """Up to ``max_messages`` leased messages, long-polling up to ``wait`` seconds for the first."""
        body = {"max_messages": max_messages, "wait_seconds": wait}
        return self._model(PullResponse, "POST", "/v1/pull", body, extra_timeout=wait).messages

    def ack(self, receipt: str) -> SettleResponse:
        """Mark done; raises LeaseLost (409) if the lease expired and was taken elsewhere."""
        return self._model(SettleResponse, "POST", "/v1/ack", {"receipt": receipt})

    def nack(
        self, receipt: str, *, requeue: bool = True, delay: float = 0.0, reason: str | None = None
    ) -> SettleResponse:
        """Give back for redelivery after ``delay`` seconds, or with ``requeue=False`` dead-letter."""
        return self._model(SettleResponse, "POST", "/v1/nack", nack_body(receipt, requeue, delay, reason))

    def extend(self, receipt: str, seconds: float) -> float:
        """Keep the lease ``seconds`` more from now; returns the new deadline (unix time)."""
        resp = self._model(SettleResponse, "POST", "/v1/extend", {"receipt": receipt, "seconds": seconds})
        assert resp.lease_until is not None
        return resp.lease_until

    def ack_batch(self, receipts: Iterable[str]) -> SettleBatchResponse:
        return self._model(SettleBatchResponse, "POST", "/v1/ack/batch", {"receipts": list(receipts)})

    def nack_batch(self, entries: Iterable[NackRequest | Mapping[str, Any]]) -> SettleBatchResponse:
        return self._model(SettleBatchResponse, "POST", "/v1/nack/batch", nack_entries(entries))

    def extend_batch(self, entries: Iterable[ExtendRequest | Mapping[str, Any]]) -> SettleBatchResponse:
        return self._model(SettleBatchResponse, "POST", "/v1/extend/batch", extend_entries(entries))

    # -- operations ------------------------------------------------------------------------------

    def ready(self) -> bool:
        """True when the sidecar is connected and serving."""
        try:
            self._call("GET", "/readyz", retry=False)
        except SidecarError:
            return False
        return True

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self._call("GET", "/v1/status"))
        return result

    def metrics(self) -> str:
        """The Prometheus exposition text."""
        return self._call("GET", "/metrics").decode()
