"""Helpers of the Spark tests: fast bulk publishing through the engine, reading topics back."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable
from typing import Any

from bucketq import Bucketq, PublishResult, Settings
from bucketq.core.keys import Keys
from bucketq.core.refsegment import load_segment
from bucketq.core.segment import Record, decode_header
from bucketq.core.txn import take_snapshot
from bucketq.spark.planning import list_segments
from bucketq.storage import open_storage

BULK = {"linger_ms": 200, "max_batch_messages": 5000, "max_batch_bytes": 8 * 1024 * 1024}


async def publish_many(
    settings: Settings,
    topic: str,
    count: int,
    *,
    partitions: int = 1,
    make: Callable[[int], dict[str, Any]] | None = None,
    create: bool = True,
    segment_messages: int = BULK["max_batch_messages"],
) -> list[PublishResult]:
    """Publish ``count`` messages with the engine's producer in big group commits (segments of up
    to ``segment_messages``)."""
    make = make or (lambda i: {"payload": {"n": i}})
    async with Bucketq(settings) as bq:
        if create:
            await bq.create_topic(topic, partitions=partitions)
        producer = await bq.register_producer("bulk", **BULK | {"max_batch_messages": segment_messages})
        results: list[PublishResult] = []
        for start in range(0, count, 20_000):
            chunk = range(start, min(count, start + 20_000))
            results += await asyncio.gather(*(producer.publish(topic, **make(i)) for i in chunk))
        return results


async def topic_records(settings: Settings, topic: str) -> list[tuple[int, int, int, Record]]:
    """Every visible message of the topic as (partition, seq, index, record), read by the engine's
    loaders (a job commit's segments only when its committed record names them)."""
    storage = await open_storage(settings)
    keys = Keys(settings.root)
    out = []
    try:
        async with Bucketq(settings) as bq:
            partitions = (await bq.catalog.config(topic)).partitions
        shown = (await take_snapshot(storage, keys, topic, abort_expired=False)).shown()
        for p in range(partitions):
            for ref in await list_segments(storage, keys, topic, p, 0, None):
                blob = await storage.get(keys.segment(topic, p, ref.seq))
                assert blob is not None
                if decode_header(blob.data).txn is not None and (p, ref.seq) not in shown:
                    continue
                for i, r in enumerate((await load_segment(storage, keys, blob.data)).records):
                    out.append((p, ref.seq, i, r))
    finally:
        await storage.close()
    return out


async def keys_under(settings: Settings, prefix: str) -> list[str]:
    storage = await open_storage(settings)
    try:
        return [info.key async for info in storage.store.list(prefix)]
    finally:
        await storage.close()


class RefusingProxy:
    """An HTTP proxy in front of an S3 server, in its own thread, that refuses or holds chosen requests.

    ``refuse(method, pattern)``: requests whose method matches and whose path matches the regex
    get 403 AccessDenied without reaching the server; ``refused`` counts them. ``hold(method,
    pattern)``: such requests wait until the proxy stops, then get 503 without ever reaching the
    server (a request in flight when its client died). ``answered`` lists (method,
    path, status) of every request the server answered and ``held`` those waiting;
    ``wait_until(check)`` blocks the calling thread until ``check()`` holds after such an event
    (no polling of the store: the proxy says when the request of interest went through).
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.url = ""
        self.refusals: list[tuple[str, re.Pattern[str]]] = []
        self.holds: list[tuple[str, re.Pattern[str]]] = []
        self.refused = 0
        self.answered: list[tuple[str, str, int]] = []
        self.held: list[tuple[str, str]] = []
        self._changed = threading.Condition()
        self._release: asyncio.Event | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: Any = None
        self._session: Any = None

    def refuse(self, method: str, pattern: str) -> None:
        self.refusals.append((method, re.compile(pattern)))

    def hold(self, method: str, pattern: str) -> None:
        self.holds.append((method, re.compile(pattern)))

    def clear(self) -> None:
        self.refusals, self.holds = [], []

    def wait_until(self, check: Callable[[], bool], timeout: float) -> bool:
        """Whether ``check()`` came true (re-checked on every answered or held request) in time."""
        with self._changed:
            return self._changed.wait_for(check, timeout)

    def _note(self, into: list[Any], entry: tuple[Any, ...]) -> None:
        with self._changed:
            into.append(entry)
            self._changed.notify_all()

    def __enter__(self) -> RefusingProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    async def _start(self) -> None:
        import aiohttp
        from aiohttp import web

        from tests.support.servers import free_ports

        self._release = asyncio.Event()
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        (port,) = free_ports(1)
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"

    async def _stop(self) -> None:
        assert self._release is not None
        self._release.set()  # held requests are answered 503, never forwarded
        await self._runner.cleanup()
        await self._session.close()

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        path = request.path
        body = await request.read()
        for method, pattern in self.refusals:
            if request.method == method and pattern.search(path):
                self.refused += 1
                xml = (
                    '<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
                    "<Message>Access Denied</Message></Error>"
                )
                return web.Response(status=403, body=xml.encode(), content_type="application/xml")
        for method, pattern in self.holds:
            if request.method == method and pattern.search(path) and self._release is not None:
                self._note(self.held, (request.method, path))
                await self._release.wait()
                return web.Response(status=503, text="held until the proxy stopped")
        hop = {"host", "content-length", "transfer-encoding", "connection"}
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body
        ) as upstream:
            payload = await upstream.read()
            out = {k: v for k, v in upstream.headers.items() if k.lower() not in hop}
            self._note(self.answered, (request.method, path, upstream.status))
            return web.Response(status=upstream.status, body=payload, headers=out)
