"""Real S3 servers for tests: moto server and SeaweedFS (``weed mini``), each a separate process.

Fixtures (exposed by ``conftest.py``):

* ``moto_server`` / ``seaweedfs_server`` (session): an :class:`S3Server` with ``endpoint_url``;
  ``server.settings(strategy=...)`` makes a fresh bucket and returns its :class:`Settings`;
* ``s3_backend``: parametrized over both servers, a fresh-bucket ``Settings`` (strategy ``auto``);
* ``memory_storage`` / ``file_storage``: an opened :class:`Storage` (strategy ``conditional_write``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from bucketq.bench.servers import (
    ACCESS_KEY,
    SECRET_KEY,
    S3Server,
    ServerUnavailable,
    _clean_env,
    free_ports,
    port_is_free,
    start_moto,
    start_seaweedfs,
)
from bucketq.config import Settings
from bucketq.storage import Storage, open_storage

__all__ = [
    "ACCESS_KEY",
    "SECRET_KEY",
    "FlakyProxy",
    "S3Server",
    "_clean_env",
    "free_ports",
    "port_is_free",
]


def _start(kind: str, workdir: Path) -> S3Server:
    """Start a server; a missing binary fails the run (``make test`` installs both)."""
    try:
        return start_moto(workdir) if kind == "moto" else start_seaweedfs(workdir)
    except ServerUnavailable as exc:
        pytest.fail(f"{kind} is not available: {exc} (run the tests through `make test`)")


class FlakyProxy:
    """An HTTP proxy in front of a real S3 server that misbehaves on purpose.

    ``proxy.fail(method, times, action)`` makes the next ``times`` requests with that HTTP
    method fail: ``"slowdown"`` answers 503 SlowDown without forwarding, ``"drop"`` forwards
    the request and then closes the connection without an answer (a lost response).
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.plan: list[list[Any]] = []  # [method, remaining, action]
        self.seen: Counter[str] = Counter()
        self.url = ""
        self._runner: Any = None
        self._session: Any = None

    def fail(self, method: str, times: int | None, action: str) -> None:
        self.plan.append([method, times, action])

    async def start(self) -> str:
        import aiohttp
        from aiohttp import web

        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        (port,) = free_ports(1)
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def _action(self, method: str) -> str | None:
        for rule in self.plan:
            if rule[0] == method and (rule[1] is None or rule[1] > 0):
                if rule[1] is not None:
                    rule[1] -= 1
                return str(rule[2])
        return None

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        self.seen[request.method] += 1
        action = self._action(request.method)
        body = await request.read()
        if action == "slowdown":
            xml = (
                '<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                "<Message>Please reduce your request rate.</Message></Error>"
            )
            return web.Response(status=503, body=xml.encode(), content_type="application/xml")
        hop = {"host", "content-length", "transfer-encoding", "connection"}
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body
        ) as upstream:
            payload = await upstream.read()
            status = upstream.status
            out = {k: v for k, v in upstream.headers.items() if k.lower() not in hop}
        if action == "drop":
            request.transport.close()  # the write landed; its answer is lost
            raise ConnectionResetError("response dropped on purpose")
        return web.Response(status=status, body=payload, headers=out)


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A moto S3 server subprocess on a free 127.0.0.1 port for the whole session."""
    server = _start("moto", tmp_path_factory.mktemp("moto"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def seaweedfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A SeaweedFS ``weed mini`` subprocess (S3 with credentials) for the whole session."""
    server = _start("seaweedfs", tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(
    params=[pytest.param("moto", marks=pytest.mark.s3), pytest.param("seaweedfs", marks=pytest.mark.s3)]
)
def s3_backend(request: pytest.FixtureRequest) -> Settings:
    """Settings (backend s3, strategy auto) for a fresh bucket on moto, then on SeaweedFS."""
    server: S3Server = request.getfixturevalue(f"{request.param}_server")
    return server.settings()


@pytest.fixture
async def memory_storage() -> AsyncIterator[Storage]:
    """An opened in-memory :class:`Storage` (conditional_write)."""
    storage = await open_storage(Settings.from_dict({"backend": "memory", "strategy": "conditional_write"}))
    try:
        yield storage
    finally:
        await storage.close()


@pytest.fixture
async def file_storage(tmp_path: Path) -> AsyncIterator[Storage]:
    """An opened filesystem :class:`Storage` in a temporary directory (conditional_write)."""
    settings = Settings.from_dict(
        {"backend": "file", "file_path": str(tmp_path / "bucket"), "strategy": "conditional_write"}
    )
    storage = await open_storage(settings)
    try:
        yield storage
    finally:
        await storage.close()
