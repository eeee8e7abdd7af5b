"""The one TCP fault proxy of the tests: it cuts an S3 server (or any TCP server) off and restores it.

``TcpProxy`` forwards ``127.0.0.1:proxy.port`` to a target in its own thread (its own event loop).
``proxy.down()`` is an outage: every open connection is aborted at once and new ones are closed as
soon as they are accepted (the client sees a reset, not a hang); ``proxy.up()`` ends it.

Use it as a context manager, or ``start()`` / ``close()`` it (a pytest fixture)::

    with TcpProxy.to(moto_server.endpoint_url) as proxy:
        settings = moto_server.settings(s3_endpoint_url=proxy.url)
        proxy.down()
        ...
        proxy.up()

Faults on single HTTP requests (a 503 answer, a lost response) are another job:
``tests.support.servers.FlakyProxy``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from urllib.parse import urlsplit

CONNECT_TIMEOUT_S = 5.0


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target``; while down, every connection is closed at once."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._up = True
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._error: BaseException | None = None

    @classmethod
    def to(cls, url: str) -> TcpProxy:
        """A proxy to the host and port of ``url`` (``http://127.0.0.1:9000``), not started yet."""
        parts = urlsplit(url)
        return cls(parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80))

    def start(self) -> TcpProxy:
        self._thread.start()
        if not self._ready.wait(10) or self._error is not None:
            raise RuntimeError(f"proxy did not start: {self._error!r}")
        return self

    def close(self) -> None:
        """Abort every connection, stop listening and end the proxy's thread (idempotent)."""
        if not self._thread.is_alive():
            return
        self._up = False
        with contextlib.suppress(RuntimeError):  # the loop already closed
            self._loop.call_soon_threadsafe(self._shutdown)
        self._thread.join(timeout=10)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def down(self) -> None:
        """Start an outage: cut every open connection, refuse new ones until :meth:`up`."""
        self._up = False
        self._loop.call_soon_threadsafe(self._cut)

    def up(self) -> None:
        """End the outage: new connections are forwarded again."""
        self._up = True

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            self._loop.close()
            return
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            # the connections were aborted: let their handlers end, then cancel what is left
            if tasks := asyncio.all_tasks(self._loop):
                _, left = self._loop.run_until_complete(asyncio.wait(tasks, timeout=2))
                for task in left:
                    task.cancel()
            self._loop.close()

    def _shutdown(self) -> None:
        self._cut()
        if self._server is not None:
            self._server.close()
        self._loop.stop()

    def _cut(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._up:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.target), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError):
            writer.transport.abort()
            return
        if not self._up:  # went down while connecting
            for w in (writer, up_writer):
                w.transport.abort()
            return
        self._writers |= {writer, up_writer}
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError):
            writer.transport.abort()
