"""Fixtures for engine tests: connections to one shared bucket on each backend."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from bucketq import Bucketq, Consumer, Message, Settings
from bucketq.storage import MemoryStore, ObjectStore
from bucketq.storage.strategies import build_store
from tests.support.store_time import TimeTravelStore

FAST = {
    "producer": {"linger_ms": 5},
    "consumer": {"poll_min_ms": 5, "poll_max_ms": 40, "heartbeat_interval_s": 0.5, "member_ttl_s": 3},
}

Connect = Callable[..., Bucketq]


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = {**out.get(k, {}), **v} if isinstance(v, dict) else v
    return out


class Backend:
    """Opens any number of :class:`Bucketq` connections to one bucket."""

    def __init__(self, name: str, data: dict[str, Any], store: ObjectStore | None = None) -> None:
        self.name = name
        self.data = _merge(data, FAST)
        self.store = store
        self.opened: list[Bucketq] = []

    def settings(self, **extra: Any) -> Settings:
        return Settings.from_dict(_merge(self.data, extra))

    async def connect(self, *, store: ObjectStore | None = None, **extra: Any) -> Bucketq:
        bq = Bucketq(self.settings(**extra), store=store or self.store)
        await bq.open()
        self.opened.append(bq)
        return bq

    async def close_all(self) -> None:
        for bq in self.opened:
            await bq.close()

    def time_travel(self) -> TimeTravelStore:
        """Connections made from now on share one store whose clock a test moves ahead
        (``advance``): GC's ages are the store's (docs/protocol.md, I15)."""
        if not isinstance(self.store, TimeTravelStore):
            self.store = TimeTravelStore(
                self.store if self.store is not None else build_store(self.settings())
            )
        return self.store


def _backend_for(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if name == "memory":
        return memory_backend()
    if name == "file":
        return Backend(name, {"backend": "file", "file_path": str(tmp_path / "bucket")})
    server = request.getfixturevalue(f"{name}_server")
    return Backend(
        name,
        server.settings().model_dump(mode="json", exclude_none=True)
        | {
            "s3_access_key_id": server.access_key,
            "s3_secret_access_key": server.secret_key,
        },
    )


@pytest.fixture(
    params=[
        "memory",
        "file",
        pytest.param("moto", marks=pytest.mark.s3),
        pytest.param("seaweedfs", marks=pytest.mark.s3),
    ]
)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    """Every backend: memory, filesystem, moto server, SeaweedFS."""
    b = _backend_for(request.param, request, tmp_path)
    yield b
    await b.close_all()


@pytest.fixture(
    params=[
        "file",
        pytest.param("moto", marks=pytest.mark.s3),
        pytest.param("seaweedfs", marks=pytest.mark.s3),
    ]
)
async def stored_backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    """The backends that store outside the process (filesystem, moto server, SeaweedFS), for
    tests whose in-memory case runs on the virtual clock as a test of its own."""
    b = _backend_for(request.param, request, tmp_path)
    yield b
    await b.close_all()


def memory_backend() -> Backend:
    """The ``backend`` fixture's in-memory case, for a test on the virtual clock (no fixture)."""
    return Backend("memory", {"backend": "memory", "strategy": "conditional_write"}, MemoryStore())


@pytest.fixture(params=["file", pytest.param("seaweedfs", marks=pytest.mark.s3)])
async def race_backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    """Backends whose put-if-absent is atomic under concurrency (for multi-member races)."""
    b = _backend_for(request.param, request, tmp_path)
    yield b
    await b.close_all()


async def drain(
    consumer: Consumer,
    expected: int,
    *,
    timeout: float = 30.0,
    ack: bool = True,
    seen: dict[str, int] | None = None,
) -> dict[str, int]:
    """Poll and ack until ``expected`` distinct messages were received; returns id → times seen."""
    seen = {} if seen is None else seen
    deadline = time.monotonic() + timeout
    while len(seen) < expected:
        if time.monotonic() > deadline:
            raise AssertionError(f"received {len(seen)} of {expected} messages within {timeout}s")
        msgs = await consumer.poll(max_messages=100, wait=0.2)
        for m in msgs:
            seen[m.id] = seen.get(m.id, 0) + 1
        if ack:
            await asyncio.gather(*(m.ack() for m in msgs))
    return seen


async def poll_one(consumer: Consumer, timeout: float = 10.0) -> Message:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msgs = await consumer.poll(max_messages=1, wait=0.2)
        if msgs:
            return msgs[0]
    raise AssertionError(f"no message within {timeout}s")
