"""The sidecar publishes on behalf of the app's connections (core/batching.Callers): the caller the
producer's group commit knows is the HTTP connection, not the task each message is published in.

An app that awaits each response on its connection is a closed loop: when every connection that
publishes waits on a batch, nothing more can arrive and the batch is written at once. For that the
producer must see one caller per connection; it would see one per message (a fresh task each),
and count a finished message's task as a caller that may come again, holding the next batch.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bucketq.config import Settings
from bucketq.sidecar.config import SidecarConfig, SidecarSettings
from bucketq.sidecar.process import Sidecar
from bucketq.sidecar.server import build_api_app
from tests.sidecar.sidecar_procs import create_topics


@pytest.fixture
async def sidecar(tmp_path: Path) -> AsyncIterator[Sidecar]:
    engine = Settings.from_dict(
        {
            "backend": "file",
            "file_path": str(tmp_path / "bucket"),
            "strategy": "conditional_write",
            # callers are remembered for a linger: long enough that none is forgotten mid-test
            "producer": {"linger_ms": 60_000},
            "ping": {"enabled": False},
        }
    )
    await create_topics(engine, "orders")
    sc = Sidecar(SidecarConfig(SidecarSettings(), engine))
    await sc.runtime.connect()
    try:
        yield sc
    finally:
        await sc.runtime.close(10)


async def _publish(client: TestClient[Any, Any], body: Any, batch: bool = False) -> None:
    path = "/v1/publish/orders" + ("/batch" if batch else "")
    async with client.post(path, data=json.dumps(body), headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 200, await resp.text()


async def test_each_connection_is_one_caller_of_the_producer(sidecar: Sidecar) -> None:
    app = build_api_app(sidecar.api, token=None)
    async with TestServer(app) as server:
        first = TestClient(server)
        second = TestClient(server)
        async with first, second:
            for i in range(3):  # one after another on one keep-alive connection
                await _publish(first, {"payload": i})
            await _publish(first, {"messages": [{"payload": i} for i in range(5)]}, batch=True)
            callers = sidecar.runtime.producer().callers
            assert len(callers) == 1, "eight messages on one connection were not one caller"
            await _publish(second, {"payload": "other"})
            assert len(callers) == 2
