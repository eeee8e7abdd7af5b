"""The asyncio client of the sidecar's localhost API (aiohttp)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar, Unpack

import aiohttp
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


class AsyncClient:
    """Talks to the sidecar at ``url`` (default ``$BUCKETQ_SIDECAR_URL`` or http://127.0.0.1:3580).

    Use as ``async with AsyncClient() as client``. Errors raise :class:`~bucketq.client.SidecarError`
    subclasses (``LeaseLost`` for 409, ``Busy`` for 429, ...). A 429 or 503 is first retried after
    the ``Retry-After`` it names, as ``retry`` says (:class:`~bucketq.client.RetryPolicy`; ``None``:
    never): ``Busy`` or ``Unavailable`` is raised once the policy gives up.
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
        self.timeout = timeout
        self.retry = retry or NO_RETRY
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers)
        return self._session

    async def _call(
        self, method: str, path: str, body: Any = None, *, extra_timeout: float = 0.0, retry: bool = True
    ) -> bytes:
        """One request, tried again after a 429 or 503 as :attr:`retry` says (:mod:`bucketq.client.retry`)."""
        tries = (self.retry if retry else NO_RETRY).begin()
        while True:
            try:
                return await self._call_once(method, path, body, extra_timeout=extra_timeout)
            except SidecarError as exc:
                wait = tries.wait_after(exc)
                if wait is None:
                    raise
            await asyncio.sleep(wait)

    async def _call_once(self, method: str, path: str, body: Any, *, extra_timeout: float) -> bytes:
        timeout = aiohttp.ClientTimeout(total=self.timeout + extra_timeout)
        try:
            async with self._http().request(method, self.url + path, json=body, timeout=timeout) as resp:
                data = await resp.read()
                if resp.status >= 400:
                    raise error_for(resp.status, data, resp.headers)
                return data
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise ConnectionFailed(0, "connection_failed", f"{method} {self.url}{path}: {exc}") from exc

    async def _model(
        self, model: type[M], method: str, path: str, body: Any = None, *, extra_timeout: float = 0.0
    ) -> M:
        return model.model_validate_json(await self._call(method, path, body, extra_timeout=extra_timeout))

    # -- publish ---------------------------------------------------------------------------------

    async def publish(
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
        return await self._model(PublishResponse, "POST", publish_path(topic), wire(m))

    async def publish_batch(
        self, topic: str, messages: Iterable[OutgoingMessage | Mapping[str, Any]]
    ) -> PublishBatchResponse:
        """Publish many messages (build them with :func:`bucketq.client.message` or as dicts).

        Check ``failed`` and each result's ``status``: entries fail one by one (e.g. 503).
        """
        return await self._model(
            PublishBatchResponse, "POST", publish_path(topic, batch=True), batch_body(messages)
        )

    # -- consume ---------------------------------------------------------------------------------

    async def pull(self, max_messages: int = 10, wait: float = 0.0) -> list[DeliveredMessage]:
        """Up to ``max_messages`` leased messages, long-polling up to ``wait`` seconds for the first."""
        body = {"max_messages": max_messages, "wait_seconds": wait}
        return (await self._model(PullResponse, "POST", "/v1/pull", body, extra_timeout=wait)).messages

    async def ack(self, receipt: str) -> SettleResponse:
        """Mark done; raises LeaseLost (409) if the lease expired and was taken elsewhere."""
        return await self._model(SettleResponse, "POST", "/v1/ack", {"receipt": receipt})

    async def nack(
        self, receipt: str, *, requeue: bool = True, delay: float = 0.0, reason: str | None = None
    ) -> SettleResponse:
        """Give back for redelivery after ``delay`` seconds, or with ``requeue=False`` dead-letter."""
        return await self._model(
            SettleResponse, "POST", "/v1/nack", nack_body(receipt, requeue, delay, reason)
        )

    async def extend(self, receipt: str, seconds: float) -> float:
        """Keep the lease ``seconds`` more from now; returns the new deadline (unix time)."""
        resp = await self._model(
            SettleResponse, "POST", "/v1/extend", {"receipt": receipt, "seconds": seconds}
        )
        assert resp.lease_until is not None
        return resp.lease_until

    async def ack_batch(self, receipts: Iterable[str]) -> SettleBatchResponse:
        return await self._model(SettleBatchResponse, "POST", "/v1/ack/batch", {"receipts": list(receipts)})

    async def nack_batch(self, entries: Iterable[NackRequest | Mapping[str, Any]]) -> SettleBatchResponse:
        return await self._model(SettleBatchResponse, "POST", "/v1/nack/batch", nack_entries(entries))

    async def extend_batch(self, entries: Iterable[ExtendRequest | Mapping[str, Any]]) -> SettleBatchResponse:
        return await self._model(SettleBatchResponse, "POST", "/v1/extend/batch", extend_entries(entries))

    # -- operations ------------------------------------------------------------------------------

    async def ready(self) -> bool:
        """True when the sidecar is connected and serving."""
        try:
            await self._call("GET", "/readyz", retry=False)
        except SidecarError:  # an error answer (503 while starting or draining) or no answer
            return False
        return True

    async def status(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(await self._call("GET", "/v1/status"))
        return result

    async def metrics(self) -> str:
        """The Prometheus exposition text."""
        return (await self._call("GET", "/metrics")).decode()
