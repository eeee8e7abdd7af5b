"""Push mode for Python apps: a tiny aiohttp server the sidecar POSTs messages to.

The handler gets a :class:`~bucketq.api_models.DeliveredMessage` and returns ``"SUCCESS"``,
``"RETRY"`` or ``"DROP"`` (``None`` or ``True`` mean success, ``False`` retry); an exception means
retry. Sync and async handlers both work (sync ones run in a thread)::

    from bucketq.client import serve

    async def handle(msg):
        print(msg.payload)

    serve(handle, port=8080)  # the sidecar runs with BUCKETQ_SIDECAR_DELIVERY=push, APP_PORT=8080
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import signal
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Literal, Self

from aiohttp import web
from pydantic import ValidationError

from bucketq.api_models import DeliveredMessage, PushBatch

log = logging.getLogger("bucketq.client.push")

Status = Literal["SUCCESS", "RETRY", "DROP"]
HandlerResult = str | bool | None  # "SUCCESS" / "RETRY" / "DROP" (any case), True, False or None
Handler = Callable[[DeliveredMessage], Awaitable[HandlerResult] | HandlerResult]


def _status(result: HandlerResult) -> Status:
    if result is None or result is True:
        return "SUCCESS"
    if result is False:
        return "RETRY"
    upper = str(result).upper()
    if upper in ("SUCCESS", "RETRY", "DROP"):
        return upper  # type: ignore[return-value]
    raise ValueError(f"push handler returned {result!r}: return 'SUCCESS', 'RETRY' or 'DROP'")


class PushServer:
    """Serves ``handler`` at ``http://host:port{path}``; ``async with PushServer(handler, port=0)``."""

    def __init__(
        self, handler: Handler, *, host: str = "127.0.0.1", port: int = 8080, path: str = "/bucketq"
    ) -> None:
        self.handler = handler
        self.host = host
        self.port = port
        self.path = path if path.startswith("/") else "/" + path
        self._runner: web.AppRunner | None = None

    async def _run_handler(self, msg: DeliveredMessage) -> Status:
        try:
            if inspect.iscoroutinefunction(self.handler):
                result = await self.handler(msg)
            else:
                result = await asyncio.to_thread(self.handler, msg)
                if inspect.isawaitable(result):
                    result = await result
            return _status(result)
        except Exception:
            log.exception("push handler failed on message %s: it will be retried", msg.id)
            return "RETRY"

    async def _receive(self, request: web.Request) -> web.Response:
        try:
            body: Any = json.loads(await request.read())
            if isinstance(body, dict) and "messages" in body:
                batch = PushBatch.model_validate(body)
                statuses = await asyncio.gather(*(self._run_handler(m) for m in batch.messages))
                return web.json_response(
                    {
                        "statuses": [
                            {"id": m.id, "status": s} for m, s in zip(batch.messages, statuses, strict=True)
                        ]
                    }
                )
            return web.json_response(
                {"status": await self._run_handler(DeliveredMessage.model_validate(body))}
            )
        except (ValueError, ValidationError) as exc:
            log.error("unreadable push request: %s", exc)
            return web.json_response({"status": "RETRY", "error": str(exc)}, status=400)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post(self.path, self._receive)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        bound = self._runner.addresses[-1] if self._runner.addresses else None
        if isinstance(bound, tuple):
            self.port = int(bound[1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


async def serve_async(
    handler: Handler, *, host: str = "127.0.0.1", port: int = 8080, path: str = "/bucketq"
) -> None:
    """Serve until SIGTERM/SIGINT (or cancellation); requests in progress finish first."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with PushServer(handler, host=host, port=port, path=path) as server:
        log.info("push handler listening on http://%s:%d%s", server.host, server.port, server.path)
        await stop.wait()


def serve(handler: Handler, *, host: str = "127.0.0.1", port: int = 8080, path: str = "/bucketq") -> None:
    """Blocking: serve ``handler`` for the sidecar's push deliveries until SIGTERM/SIGINT."""
    asyncio.run(serve_async(handler, host=host, port=port, path=path))
